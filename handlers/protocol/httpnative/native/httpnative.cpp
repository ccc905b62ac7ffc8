// An HTTP/1.1 front end for Python built on libevent's evhttp.
//
// libevent threads (one event_base and one evhttp each, all accepting on the listening socket
// Python bound) accept connections, parse requests (evhttp: request line, headers, chunked or
// Content-Length bodies, keep-alive, pipelining, 100-continue) and hold each complete request
// until Python answers it. A complete request is put on one queue; an eventfd becomes readable
// when the queue goes from empty to non-empty, and the asyncio loop takes the whole queue in one
// call (`Server.drain`), as the gRPC front end does (handlers/protocol/grpc/native).
//
// Python answers through the `Request` object (`reply`, or `start` / `write` / `end` for a
// streamed body); each answer is queued to the request's libevent thread, which is woken by an
// event made active from Python's thread (evthread_use_pthreads), and written there.
//
// A body over the limit is refused by evhttp with 413 before it is buffered (a declared one before
// any of it is read; a chunked one as soon as it passes the limit), then read and dropped
// (lingering close) so the client sees the answer. libevent threads never touch Python objects.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "frontend.h"  // handlers/protocol/native: the queue to the asyncio loop

namespace {

class Hub;
class Worker;

// One request, from evhttp's callback until Python's last answer is written (or dropped).
// Owned jointly: the worker until the answer is written, each queued event/op, the Python object.
struct Req {
  std::atomic<int> refs{1};
  Worker* worker = nullptr;
  evhttp_request* evreq = nullptr;  // touched on the worker's thread only
  std::string method;
  std::string uri;
  std::vector<std::pair<std::string, std::string>> headers;
  evbuffer* body = nullptr;  // moved out of evhttp's input buffer (no copy)
  std::string peer;
  int peer_port = 0;
  int http_minor = 1;
  uint64_t id = 0;
  event* watch = nullptr;  // EV_CLOSED on the connection while the request is in flight (worker thread)
  bool answered = false;  // Python's final answer is queued (Python thread, GIL held)
  bool started = false;   // a streamed answer was started (Python thread)

  void Ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (body != nullptr) evbuffer_free(body);
      if (watch != nullptr) event_free(watch);  // (only when the worker is gone)
      delete this;
    }
  }
};

enum EventKind { REQUEST = 0, DISCONNECT = 1 };

struct Event {
  int kind;
  Req* req;  // holds a ref
};

// The queue between the libevent threads and the asyncio loop.
class Hub {
 public:
  void Push(int kind, Req* req) { queue.Push(Event{kind, req}); }  // takes the caller's ref

  frontend::EventQueue<Event> queue;
  std::atomic<uint64_t> next_id{1};
};

// Python's answers, applied on the worker's thread.
struct Op {
  enum Kind { REPLY, START, WRITE, END };
  Req* req;  // holds a ref
  Kind kind;
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  evbuffer* body = nullptr;  // filled on Python's thread (the one copy), moved into evhttp's output
  bool close = false;  // ask the client to close the connection (draining)
};

evbuffer* BufferOf(const void* data, size_t size) {
  evbuffer* buffer = evbuffer_new();
  if (buffer != nullptr && size > 0) evbuffer_add(buffer, data, size);
  return buffer;
}

struct ConnState {
  int pending = 0;  // requests handed to Python and not yet answered and written
};

class Worker {
 public:
  Worker(Hub* hub, int listen_fd, int64_t max_body, double timeout) : hub_(hub) {
    base_ = event_base_new();
    http_ = evhttp_new(base_);
    evhttp_set_default_content_type(http_, nullptr);
    evhttp_set_allowed_methods(http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
                                          EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                          EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    evhttp_set_max_body_size(http_, max_body);
    evhttp_set_max_headers_size(http_, 64 * 1024);
    struct timeval tv;
    tv.tv_sec = static_cast<time_t>(timeout);
    tv.tv_usec = static_cast<suseconds_t>((timeout - static_cast<double>(tv.tv_sec)) * 1e6);
    evhttp_set_timeout_tv(http_, &tv);
    evhttp_set_gencb(http_, &Worker::OnRequest, this);
    evhttp_set_flags(http_, EVHTTP_SERVER_LINGERING_CLOSE);  // a refused body is read and dropped, so the client sees the 413
    bound_ = evhttp_accept_socket_with_handle(http_, listen_fd);
    wake_ = event_new(base_, -1, 0, &Worker::OnWake, this);
    stop_timer_ = evtimer_new(base_, &Worker::OnStopTimer, this);
  }

  bool ok() const { return base_ != nullptr && http_ != nullptr && bound_ != nullptr && wake_ != nullptr; }

  void Start() {
    thread_ = std::thread([this] {
      event_base_dispatch(base_);
      evhttp_free(http_);  // closes what is left (past the grace period)
      http_ = nullptr;
    });
  }

  // Any thread.
  void Push(Op op) {
    bool was_empty;
    {
      std::lock_guard<std::mutex> lock(mu_);
      was_empty = ops_.empty();
      ops_.push_back(std::move(op));
    }
    if (was_empty) event_active(wake_, EV_READ, 0);
  }

  void StopAccepting() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_accepting_ = true;
    }
    event_active(wake_, EV_READ, 0);
  }

  // Close idle connections, wait (up to the deadline) for the others, then end the thread.
  void Finish(double grace) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finish_ = true;
      deadline_ = std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(grace * 1e6));
    }
    event_active(wake_, EV_READ, 0);
  }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  ~Worker() {
    if (stop_timer_ != nullptr) event_free(stop_timer_);
    if (wake_ != nullptr) event_free(wake_);
    if (http_ != nullptr) evhttp_free(http_);
    if (base_ != nullptr) event_base_free(base_);
  }

 private:
  static void OnRequest(evhttp_request* evreq, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    Req* req = new Req();
    req->worker = self;
    req->evreq = evreq;
    switch (evhttp_request_get_command(evreq)) {
      case EVHTTP_REQ_GET: req->method = "GET"; break;
      case EVHTTP_REQ_POST: req->method = "POST"; break;
      case EVHTTP_REQ_HEAD: req->method = "HEAD"; break;
      case EVHTTP_REQ_PUT: req->method = "PUT"; break;
      case EVHTTP_REQ_DELETE: req->method = "DELETE"; break;
      case EVHTTP_REQ_OPTIONS: req->method = "OPTIONS"; break;
      case EVHTTP_REQ_TRACE: req->method = "TRACE"; break;
      case EVHTTP_REQ_CONNECT: req->method = "CONNECT"; break;
      case EVHTTP_REQ_PATCH: req->method = "PATCH"; break;
      default: req->method = "GET"; break;
    }
    const char* uri = evhttp_request_get_uri(evreq);
    req->uri = uri != nullptr ? uri : "/";
    evkeyvalq* headers = evhttp_request_get_input_headers(evreq);
    for (evkeyval* h = headers->tqh_first; h != nullptr; h = h->next.tqe_next) {
      std::string name(h->key);
      for (char& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
      req->headers.emplace_back(std::move(name), h->value);
    }
    req->body = evbuffer_new();
    evbuffer_add_buffer(req->body, evhttp_request_get_input_buffer(evreq));
    req->http_minor = evreq->minor;
    evhttp_connection* evcon = evhttp_request_get_connection(evreq);
    if (evcon != nullptr) {
      char* address = nullptr;
      ev_uint16_t port = 0;
      evhttp_connection_get_peer(evcon, &address, &port);
      if (address != nullptr) req->peer = address;
      req->peer_port = port;
      auto found = self->conns_.find(evcon);
      if (found == self->conns_.end()) {
        found = self->conns_.emplace(evcon, ConnState()).first;
        evhttp_connection_set_closecb(evcon, &Worker::OnClose, self);
      }
      found->second.pending += 1;
    }
    evhttp_request_set_on_complete_cb(evreq, &Worker::OnComplete, self);
    req->id = self->hub_->next_id.fetch_add(1);
    req->Ref();  // the worker's, until the answer is written
    // evhttp reads nothing more from the connection until it is answered: watch it for the
    // client closing it (EPOLLRDHUP), so Python learns of a client that left
    bufferevent* bev = evcon != nullptr ? evhttp_connection_get_bufferevent(evcon) : nullptr;
    if (bev != nullptr && bufferevent_getfd(bev) >= 0) {
      req->watch = event_new(self->base_, bufferevent_getfd(bev), EV_CLOSED, &Worker::OnPeerClosed, req);
      if (req->watch != nullptr) event_add(req->watch, nullptr);
    }
    self->hub_->Push(REQUEST, req);
  }

  // The client closed its connection while its request is in flight: drop the connection (and
  // with it evhttp's request; Python's answer, if it comes, goes nowhere) and tell Python.
  static void OnPeerClosed(evutil_socket_t, short, void* arg) {
    Req* req = static_cast<Req*>(arg);
    Worker* self = req->worker;
    event_free(req->watch);
    req->watch = nullptr;
    evhttp_request* evreq = req->evreq;
    if (evreq == nullptr) return;
    req->evreq = nullptr;
    evhttp_connection* evcon = evhttp_request_get_connection(evreq);
    if (evcon != nullptr) {
      self->conns_.erase(evcon);
      evhttp_connection_free(evcon);  // frees evreq too
    }
    self->hub_->Push(DISCONNECT, req);  // takes the worker's ref
  }

  static void OnComplete(evhttp_request* evreq, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    evhttp_connection* evcon = evhttp_request_get_connection(evreq);
    auto found = self->conns_.find(evcon);
    if (found != self->conns_.end() && found->second.pending > 0) found->second.pending -= 1;
  }

  static void OnClose(evhttp_connection* evcon, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    self->conns_.erase(evcon);
  }

  static void OnWake(evutil_socket_t, short, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    std::vector<Op> ops;
    bool stop_accepting, finish;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      ops.swap(self->ops_);
      stop_accepting = self->stop_accepting_;
      finish = self->finish_;
    }
    for (Op& op : ops) {
      self->Apply(op);
      if (op.body != nullptr) evbuffer_free(op.body);
      op.req->Unref();
    }
    if (stop_accepting && self->bound_ != nullptr) {
      evhttp_del_accept_socket(self->http_, self->bound_);
      self->bound_ = nullptr;
    }
    if (finish) self->TryFinish();
  }

  static void OnStopTimer(evutil_socket_t, short, void* arg) { static_cast<Worker*>(arg)->TryFinish(); }

  void TryFinish() {
    bool busy = false;
    std::vector<evhttp_connection*> idle;
    for (auto& entry : conns_) {
      if (entry.second.pending > 0) {
        busy = true;
      } else {
        idle.push_back(entry.first);
      }
    }
    // idle keep-alive connections: closed now (a request arriving on one races the close, as
    // it does with any server that closes idle connections)
    for (evhttp_connection* evcon : idle) {
      if (!HasOutput(evcon)) {
        conns_.erase(evcon);
        evhttp_connection_free(evcon);
      } else {
        busy = true;
      }
    }
    if (busy && std::chrono::steady_clock::now() < deadline_) {
      struct timeval tv = {0, 10000};
      evtimer_add(stop_timer_, &tv);
      return;
    }
    event_base_loopbreak(base_);
  }

  static bool HasOutput(evhttp_connection* evcon) {
    bufferevent* bev = evhttp_connection_get_bufferevent(evcon);
    return bev != nullptr && evbuffer_get_length(bufferevent_get_output(bev)) > 0;
  }

  void Apply(Op& op) {
    evhttp_request* evreq = op.req->evreq;
    if (evreq == nullptr) return;
    bool final = op.kind == Op::REPLY || op.kind == Op::END;
    if (op.kind == Op::REPLY || op.kind == Op::START) {
      evkeyvalq* out = evhttp_request_get_output_headers(evreq);
      for (auto& header : op.headers) evhttp_add_header(out, header.first.c_str(), header.second.c_str());
      if (op.close) {
        evhttp_remove_header(out, "Connection");
        evhttp_add_header(out, "Connection", "close");
      }
    }
    bool detached = evhttp_request_get_connection(evreq) == nullptr;
    switch (op.kind) {
      case Op::REPLY: {
        // evhttp writes whatever body it is given: none for HEAD, 204 and 304 (RFC 9110)
        bool no_body = evhttp_request_get_command(evreq) == EVHTTP_REQ_HEAD || op.status == 204 || op.status == 304;
        if (no_body) evbuffer_drain(op.body, evbuffer_get_length(op.body));
        evhttp_send_reply(evreq, op.status, nullptr, op.body);  // moves the chains, no copy
        break;
      }
      case Op::START:
        evhttp_send_reply_start(evreq, op.status, nullptr);
        break;
      case Op::WRITE:
        if (evbuffer_get_length(op.body) > 0) evhttp_send_reply_chunk(evreq, op.body);
        break;
      case Op::END:
        evhttp_send_reply_end(evreq);
        break;
    }
    (void)detached;
    if (final) {
      if (op.req->watch != nullptr) {
        event_free(op.req->watch);
        op.req->watch = nullptr;
      }
      op.req->evreq = nullptr;  // evhttp owns (and frees) it from here
      op.req->Unref();          // the worker's ref
    }
  }

  Hub* hub_;
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  evhttp_bound_socket* bound_ = nullptr;
  event* wake_ = nullptr;
  event* stop_timer_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Op> ops_;
  bool stop_accepting_ = false;
  bool finish_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::unordered_map<evhttp_connection*, ConnState> conns_;  // worker thread only
};

// ---- Python objects -----------------------------------------------------------------------------

struct PyReq {
  PyObject_HEAD
  Req* req;
};

void PyReq_dealloc(PyReq* self) {
  Req* req = self->req;
  if (req != nullptr) {
    if (!req->answered) {  // dropped without an answer: 500 rather than a hung client
      req->answered = true;
      Op op{req, Op::REPLY};
      op.status = 500;
      op.headers.emplace_back("content-type", "application/json");
      static const char kBody[] = "{\"error\":\"internal error: no response\"}";
      op.body = BufferOf(kBody, sizeof kBody - 1);
      req->Ref();
      req->worker->Push(std::move(op));
    }
    req->Unref();
  }
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

bool ParseHeaders(PyObject* headers, std::vector<std::pair<std::string, std::string>>* out) {
  PyObject* seq = PySequence_Fast(headers, "headers must be a sequence of (name, value) pairs");
  if (seq == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  out->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
    const char* name;
    const char* value;
    Py_ssize_t name_len, value_len;
    if (!PyArg_ParseTuple(pair, "y#y#", &name, &name_len, &value, &value_len)) {
      Py_DECREF(seq);
      return false;
    }
    if (memchr(name, '\n', name_len) || memchr(name, '\r', name_len) || memchr(value, '\n', value_len) ||
        memchr(value, '\r', value_len)) {
      PyErr_SetString(PyExc_ValueError, "a header name or value holds a line break");
      Py_DECREF(seq);
      return false;
    }
    out->emplace_back(std::string(name, name_len), std::string(value, value_len));
  }
  Py_DECREF(seq);
  return true;
}

bool Check(PyReq* self, bool streaming_ok) {
  if (self->req->answered) {
    PyErr_SetString(PyExc_RuntimeError, "the response is already complete");
    return false;
  }
  if (!streaming_ok && self->req->started) {
    PyErr_SetString(PyExc_RuntimeError, "the response was started");
    return false;
  }
  return true;
}

// reply(status, headers, body, close=False): the whole response.
PyObject* PyReq_reply(PyReq* self, PyObject* args) {
  int status, close = 0;
  PyObject* headers;
  Py_buffer body;
  if (!PyArg_ParseTuple(args, "iOy*|p", &status, &headers, &body, &close)) return nullptr;
  if (!Check(self, false)) {
    PyBuffer_Release(&body);
    return nullptr;
  }
  Op op{self->req, Op::REPLY};
  op.status = status;
  op.close = close != 0;
  if (!ParseHeaders(headers, &op.headers)) {
    PyBuffer_Release(&body);
    return nullptr;
  }
  op.body = BufferOf(body.buf, static_cast<size_t>(body.len));
  PyBuffer_Release(&body);
  if (op.body == nullptr) return PyErr_NoMemory();
  self->req->answered = true;
  self->req->Ref();
  self->req->worker->Push(std::move(op));
  Py_RETURN_NONE;
}

// start(status, headers, close=False): a streamed response (chunked unless headers give a length).
PyObject* PyReq_start(PyReq* self, PyObject* args) {
  int status, close = 0;
  PyObject* headers;
  if (!PyArg_ParseTuple(args, "iO|p", &status, &headers, &close)) return nullptr;
  if (!Check(self, false)) return nullptr;
  Op op{self->req, Op::START};
  op.status = status;
  op.close = close != 0;
  if (!ParseHeaders(headers, &op.headers)) return nullptr;
  self->req->started = true;
  self->req->Ref();
  self->req->worker->Push(std::move(op));
  Py_RETURN_NONE;
}

PyObject* PyReq_write(PyReq* self, PyObject* arg) {
  Py_buffer body;
  if (PyObject_GetBuffer(arg, &body, PyBUF_SIMPLE) < 0) return nullptr;
  if (!Check(self, true) || !self->req->started) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "start the response first");
    PyBuffer_Release(&body);
    return nullptr;
  }
  Op op{self->req, Op::WRITE};
  op.body = BufferOf(body.buf, static_cast<size_t>(body.len));
  PyBuffer_Release(&body);
  if (op.body == nullptr) return PyErr_NoMemory();
  self->req->Ref();
  self->req->worker->Push(std::move(op));
  Py_RETURN_NONE;
}

PyObject* PyReq_end(PyReq* self, PyObject*) {
  if (!Check(self, true) || !self->req->started) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "start the response first");
    return nullptr;
  }
  Op op{self->req, Op::END};
  self->req->answered = true;
  self->req->Ref();
  self->req->worker->Push(std::move(op));
  Py_RETURN_NONE;
}

PyObject* PyReq_body(PyReq* self, PyObject*) {
  // The whole body as bytes (one copy, out of the evbuffer's chains); empty after the first call.
  evbuffer* body = self->req->body;
  if (body == nullptr) return PyBytes_FromStringAndSize(nullptr, 0);
  size_t length = evbuffer_get_length(body);
  PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length));
  if (bytes == nullptr) return nullptr;
  if (length > 0) evbuffer_remove(body, PyBytes_AS_STRING(bytes), length);
  evbuffer_free(body);
  self->req->body = nullptr;
  return bytes;
}

PyObject* PyReq_headers(PyReq* self, PyObject*) {
  auto& headers = self->req->headers;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(headers.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < headers.size(); ++i) {
    PyObject* item = Py_BuildValue("(y#y#)", headers[i].first.data(), static_cast<Py_ssize_t>(headers[i].first.size()),
                                   headers[i].second.data(), static_cast<Py_ssize_t>(headers[i].second.size()));
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

PyObject* PyReq_get_method(PyReq* self, void*) {
  return PyUnicode_FromStringAndSize(self->req->method.data(), static_cast<Py_ssize_t>(self->req->method.size()));
}

PyObject* PyReq_get_uri(PyReq* self, void*) {
  return PyBytes_FromStringAndSize(self->req->uri.data(), static_cast<Py_ssize_t>(self->req->uri.size()));
}

PyObject* PyReq_get_client(PyReq* self, void*) {
  if (self->req->peer.empty()) Py_RETURN_NONE;
  return Py_BuildValue("(si)", self->req->peer.c_str(), self->req->peer_port);
}

PyObject* PyReq_get_id(PyReq* self, void*) { return PyLong_FromUnsignedLongLong(self->req->id); }

PyObject* PyReq_get_http_version(PyReq* self, void*) {
  return PyUnicode_FromString(self->req->http_minor == 0 ? "1.0" : "1.1");
}

PyMethodDef PyReq_methods[] = {
    {"reply", reinterpret_cast<PyCFunction>(PyReq_reply), METH_VARARGS,
     "reply(status, headers, body, close=False): the whole response (headers: (bytes, bytes) pairs)."},
    {"start", reinterpret_cast<PyCFunction>(PyReq_start), METH_VARARGS,
     "start(status, headers, close=False): begin a streamed response."},
    {"write", reinterpret_cast<PyCFunction>(PyReq_write), METH_O, "write(data): one piece of a streamed response."},
    {"end", reinterpret_cast<PyCFunction>(PyReq_end), METH_NOARGS, "end(): finish a streamed response."},
    {"body", reinterpret_cast<PyCFunction>(PyReq_body), METH_NOARGS, "The request body (once)."},
    {"headers", reinterpret_cast<PyCFunction>(PyReq_headers), METH_NOARGS,
     "The request headers: a list of (lowercased name, value) bytes pairs."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef PyReq_getset[] = {
    {"method", reinterpret_cast<getter>(PyReq_get_method), nullptr, "The request method.", nullptr},
    {"uri", reinterpret_cast<getter>(PyReq_get_uri), nullptr, "The request target as sent (bytes).", nullptr},
    {"client", reinterpret_cast<getter>(PyReq_get_client), nullptr, "(host, port) of the client.", nullptr},
    {"http_version", reinterpret_cast<getter>(PyReq_get_http_version), nullptr, "'1.0' or '1.1'.", nullptr},
    {"id", reinterpret_cast<getter>(PyReq_get_id), nullptr,
     "The request's id (what drain() gives, an int, when its client leaves before the answer ends).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject PyReqType = {PyVarObject_HEAD_INIT(nullptr, 0)};

struct PyServer {
  PyObject_HEAD
  Hub* hub;
  std::vector<Worker*>* workers;
  bool finished;
};

int PyServer_init(PyServer* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"fd", "max_body", "threads", "timeout", nullptr};
  int fd, threads = 1;
  long long max_body;
  double timeout = 75.0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iL|id", const_cast<char**>(keywords), &fd, &max_body, &threads,
                                   &timeout)) {
    return -1;
  }
  if (self->workers != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "already initialised");
    return -1;
  }
  if (threads < 1) threads = 1;
  self->hub = new Hub();
  self->workers = new std::vector<Worker*>();
  for (int i = 0; i < threads; ++i) {
    int own = dup(fd);
    if (own < 0) {
      PyErr_SetFromErrno(PyExc_OSError);
      return -1;
    }
    evutil_make_socket_nonblocking(own);  // the accept loop reads until EAGAIN (shared by every copy)
    Worker* worker = new Worker(self->hub, own, max_body, timeout);
    if (!worker->ok()) {
      delete worker;
      PyErr_SetString(PyExc_OSError, "cannot start an HTTP worker (libevent)");
      return -1;
    }
    self->workers->push_back(worker);
  }
  for (Worker* worker : *self->workers) worker->Start();
  return 0;
}

PyObject* PyServer_drain(PyServer* self, PyObject*) {
  auto wrap = [](Event& event) -> PyObject* {
    if (event.kind == REQUEST) {
      PyReq* wrapped = PyObject_New(PyReq, &PyReqType);
      if (wrapped == nullptr) {
        event.req->Unref();
        return nullptr;
      }
      wrapped->req = event.req;  // takes the queue's ref
      return reinterpret_cast<PyObject*>(wrapped);
    }
    PyObject* id = PyLong_FromUnsignedLongLong(event.req->id);  // DISCONNECT: the request's id
    event.req->Unref();
    return id;
  };
  return frontend::DrainList(self->hub->queue, wrap, [](Event& event) { event.req->Unref(); });
}

PyObject* PyServer_stop_accepting(PyServer* self, PyObject*) {
  for (Worker* worker : *self->workers) worker->StopAccepting();
  Py_RETURN_NONE;
}

PyObject* PyServer_shutdown(PyServer* self, PyObject* args) {
  double grace;
  if (!PyArg_ParseTuple(args, "d", &grace)) return nullptr;
  if (self->workers == nullptr || self->finished) Py_RETURN_NONE;
  self->finished = true;
  std::vector<Worker*>* workers = self->workers;
  Py_BEGIN_ALLOW_THREADS
  for (Worker* worker : *workers) worker->StopAccepting();
  for (Worker* worker : *workers) worker->Finish(grace);
  for (Worker* worker : *workers) worker->Join();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* PyServer_fileno(PyServer* self, PyObject*) { return PyLong_FromLong(self->hub->queue.fd()); }

void PyServer_dealloc(PyServer* self) {
  if (self->workers != nullptr && !self->finished) {
    Py_BEGIN_ALLOW_THREADS
    for (Worker* worker : *self->workers) worker->Finish(0.0);
    for (Worker* worker : *self->workers) worker->Join();
    Py_END_ALLOW_THREADS
    self->finished = true;
  }
  if (self->hub != nullptr) {
    for (Event& event : self->hub->queue.Take()) event.req->Unref();
  }
  // workers and hub are leaked on purpose: requests still held by Python point at them (a server
  // is made once per process)
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMethodDef PyServer_methods[] = {
    {"drain", reinterpret_cast<PyCFunction>(PyServer_drain), METH_NOARGS, "Take every pending event: a list of Request (a new request) and int (the id of a request "
     "whose client closed the connection before its answer ended)."},
    {"stop_accepting", reinterpret_cast<PyCFunction>(PyServer_stop_accepting), METH_NOARGS,
     "Stop accepting connections (the listening socket stays open until Python closes it)."},
    {"shutdown", reinterpret_cast<PyCFunction>(PyServer_shutdown), METH_VARARGS,
     "shutdown(grace): stop accepting, close idle connections, wait up to grace seconds for the "
     "answers in flight to be written, then close the rest (blocks; call it off the event loop)."},
    {"fileno", reinterpret_cast<PyCFunction>(PyServer_fileno), METH_NOARGS,
     "The eventfd that is readable while requests wait."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject PyServerType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_httpnative",
                          "libevent (evhttp) front end that hands complete HTTP requests to Python.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__httpnative(void) {
  if (evthread_use_pthreads() != 0) {
    PyErr_SetString(PyExc_ImportError, "libevent has no pthreads support");
    return nullptr;
  }
  PyReqType.tp_name = "_httpnative.Request";
  PyReqType.tp_basicsize = sizeof(PyReq);
  PyReqType.tp_flags = Py_TPFLAGS_DEFAULT;
  PyReqType.tp_dealloc = reinterpret_cast<destructor>(PyReq_dealloc);
  PyReqType.tp_methods = PyReq_methods;
  PyReqType.tp_getset = PyReq_getset;
  PyReqType.tp_doc = "One HTTP request (made by Server.drain).";

  PyServerType.tp_name = "_httpnative.Server";
  PyServerType.tp_basicsize = sizeof(PyServer);
  PyServerType.tp_flags = Py_TPFLAGS_DEFAULT;
  PyServerType.tp_new = PyType_GenericNew;
  PyServerType.tp_init = reinterpret_cast<initproc>(PyServer_init);
  PyServerType.tp_dealloc = reinterpret_cast<destructor>(PyServer_dealloc);
  PyServerType.tp_methods = PyServer_methods;
  PyServerType.tp_doc =
      "Server(fd, max_body, threads=1, timeout=75.0): serve HTTP on the listening socket "
      "`fd` (duplicated; the caller keeps and closes its own).";

  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  if (!frontend::AddType(module, &PyServerType, "Server") || !frontend::AddType(module, &PyReqType, "Request")) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
