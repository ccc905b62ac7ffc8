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
// event made active from Python's thread (evthread_use_pthreads), and written there. A streamed
// body is flow-controlled: `write` says how many bytes are written and not taken by the kernel
// yet, and `wait_writable(low)` asks for a ("writable", id) event once no more than `low` are
// (the native gRPC front end's WRITABLE, in bytes).
//
// Each connection's request heads are read once more, before evhttp parses them (a callback on
// its input buffer: `Head`), for what evhttp 2.1 cannot do itself:
// - a declared body over the limit is answered 413 with the JSON error at once, before any of
//   it is read; the connection then ends (evhttp reads and drops the body, so the client sees
//   the answer: lingering close);
// - a method evhttp does not know (QUERY, PROPFIND, ...) reaches Python by its name (evhttp 2.1
//   keeps none), and a body it would not read for one (or for HEAD, TRACE) is dropped;
// - the answers evhttp still writes itself (400 for a malformed request, 413 for a chunked body
//   passing the limit, 417) are rewritten, before they are sent, with a JSON body.
// libevent threads never touch Python objects.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <errno.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
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
  bool started = false;   // a streamed answer was started (Python thread, before its START op is queued)
  bool close = false;     // its answer closes the connection (a body evhttp did not read is left on it)

  // A streamed answer's flow (Request.write / wait_writable): what Python wrote and the kernel has
  // not taken yet is `queued` (in ops the worker has not applied) + `buffered` (the connection's
  // output, chunk framing included). A writer past its high mark waits for a WRITABLE event, owed
  // once that falls to `writable_at`; a connection that is gone owes none (its DISCONNECT wakes).
  std::atomic<int64_t> queued{0};    // Python adds, the worker takes off
  std::atomic<int64_t> buffered{0};  // the worker's, while the answer streams
  std::mutex flow_mu;
  bool want_writable = false;  // (flow_mu)
  int64_t writable_at = 0;     // (flow_mu)
  bool gone = false;           // (flow_mu)
  int64_t Outstanding() const { return queued.load() + buffered.load(); }

  void Ref() { refs.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (body != nullptr) evbuffer_free(body);
      if (watch != nullptr) event_free(watch);  // (only when the worker is gone)
      delete this;
    }
  }
};

enum EventKind { REQUEST = 0, DISCONNECT = 1, WRITABLE = 2 };

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

// The JSON bodies of the answers the front end gives without Python (made by the Python side:
// the messages are the runtime's own, handlers/limits.py).
struct Refusals {
  std::string declared_prefix, declared_suffix;  // 413 for a declared body: prefix + size + suffix
  std::string too_large;  // 413 for a chunked body passing the limit
  std::string bad_request;  // 400 for a request evhttp cannot parse
};

// Per connection (worker thread only): what the next request's head says, read from the
// connection's input buffer before evhttp parses it, and the connection's state for the drain.
struct Head {
  Worker* worker = nullptr;
  bufferevent* bev = nullptr;
  evbuffer_cb_entry* on_input = nullptr;
  evbuffer_cb_entry* on_output = nullptr;
  evhttp_connection* evcon = nullptr;  // known once bytes came on it (its close callback is set then)
  bool expect = true;        // a head is coming that is not read yet
  std::string seen;          // ... its bytes so far (evhttp takes each line off the input once it is whole)
  size_t scanned = 0;        // ... searched for its end up to here
  bool refused = false;      // answered 413 here: the connection ends
  bool busy = false;         // a request of it is with Python (its answer not written yet)
  uint64_t refuse = 0;       // the declared size of a pipelined head to refuse once that answer is written
  bool fixup = false;        // a look at evhttp's own answer is scheduled
  bool linger = false;       // evhttp answered an error: drop what the client still sends once it closes
  std::string method;        // the head's method when evhttp does not know it
  uint64_t body_left = 0;    // the head's body evhttp will not read (HEAD, TRACE, unknown methods)
  bool close_next = false;   // ... when it cannot be dropped (chunked): close after the answer
  uint64_t skip = 0;         // bytes of such a body still to drop
  uint64_t pull = 0;         // the head's declared body not in the input yet (PullBody reads it);
                             // > 0 only between the head's end and evhttp handing the request over
  bool pulling = false;      // PullBody is adding to the input (its callbacks run again)
  Req* stream = nullptr;     // the streamed answer being written on it (holds a ref): its flow
};

constexpr size_t kMaxHead = 64 * 1024;  // evhttp_set_max_headers_size below
constexpr ev_uint16_t kEveryMethod = 0xFFFF;  // with EVHTTP_REQ_UNKNOWN_ (1 << 15 in libevent 2.1)

bool KnownMethod(const std::string& method, bool* reads_body) {
  static const char* const kWithBody[] = {"GET", "POST", "PUT", "DELETE", "OPTIONS", "CONNECT", "PATCH"};
  for (const char* known : kWithBody) {
    if (method == known) {
      *reads_body = true;
      return true;
    }
  }
  *reads_body = false;  // evhttp_method_may_have_body: HEAD, TRACE and the rest read none
  return method == "HEAD" || method == "TRACE";
}

bool SameName(const char* data, size_t size, const char* name) {
  return size == strlen(name) && strncasecmp(data, name, size) == 0;
}

class Worker {
 public:
  Worker(Hub* hub, int listen_fd, int64_t max_body, double timeout, const Refusals* refusals)
      : hub_(hub), max_body_(static_cast<uint64_t>(max_body)), refusals_(refusals) {
    // epoll's changes batched per loop turn (libevent's changelist): evhttp turns a connection's
    // read and write interest on and off around every request, and the in-flight watch adds and
    // removes EPOLLRDHUP, 6 epoll_ctl calls per request; batched, ~2. libevent's one caveat
    // is a socket with two descriptors (dup): a descriptor closed before the loop's next turn
    // keeps its epoll entry while the other one holds the socket open, so the loop would be woken
    // for it without end. No descriptor closed here has a copy: a lingering connection keeps
    // evhttp's own descriptor (Linger), and the listening socket's copy leaves epoll a turn before
    // it is closed (StopAccepting's second step, OnUnbind).
    event_config* config = event_config_new();
    if (config != nullptr) {
      event_config_set_flag(config, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
      base_ = event_base_new_with_config(config);
      event_config_free(config);
    }
    if (base_ == nullptr) return;
    http_ = evhttp_new(base_);
    evhttp_set_default_content_type(http_, nullptr);
    evhttp_set_allowed_methods(http_, kEveryMethod);  // every method reaches Python, which answers (405, 404)
    evhttp_set_max_body_size(http_, max_body);
    evhttp_set_max_headers_size(http_, kMaxHead);
    evhttp_set_bevcb(http_, &Worker::OnConnection, this);
    struct timeval tv;
    tv.tv_sec = static_cast<time_t>(timeout);
    tv.tv_usec = static_cast<suseconds_t>((timeout - static_cast<double>(tv.tv_sec)) * 1e6);
    evhttp_set_timeout_tv(http_, &tv);
    evhttp_set_gencb(http_, &Worker::OnRequest, this);
    evhttp_set_flags(http_, EVHTTP_SERVER_LINGERING_CLOSE);  // a refused body is read and dropped, so the client sees the 413
    bound_ = evhttp_accept_socket_with_handle(http_, listen_fd);
    wake_ = event_new(base_, -1, 0, &Worker::OnWake, this);
    stop_timer_ = evtimer_new(base_, &Worker::OnStopTimer, this);
    fixup_ = event_new(base_, -1, 0, &Worker::OnFixup, this);
  }

  bool ok() const {
    return base_ != nullptr && http_ != nullptr && bound_ != nullptr && wake_ != nullptr && fixup_ != nullptr;
  }

  void Start() {
    thread_ = std::thread([this] {
      event_base_dispatch(base_);
      evhttp_free(http_);  // closes what is left (past the grace period)
      http_ = nullptr;
      EndLingering();  // their answers were sent long ago: the clients see the connections end now
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
    if (fixup_ != nullptr) event_free(fixup_);
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
      default: req->method = "UNKNOWN"; break;  // evhttp's EVHTTP_REQ_UNKNOWN_: its name is the head's
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
      self->NextHead(evcon, req);
      char* address = nullptr;
      ev_uint16_t port = 0;
      evhttp_connection_get_peer(evcon, &address, &port);
      if (address != nullptr) req->peer = address;
      req->peer_port = port;
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
      Head* head = self->HeadOf(evcon);
      if (head != nullptr && head->stream == req) self->EndStream(head, true);
      evhttp_connection_free(evcon);  // frees evreq too
    }
    self->MarkGone(req);
    self->hub_->Push(DISCONNECT, req);  // takes the worker's ref
  }

  static void OnComplete(evhttp_request* evreq, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    Head* head = self->HeadOf(evhttp_request_get_connection(evreq));
    if (head != nullptr) {  // the answer is written: the connection is free for the next
      head->busy = false;
      if (head->refuse > 0) self->Refuse(head, head->refuse);
    }
  }

  static void OnClose(evhttp_connection* evcon, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    bufferevent* bev = evhttp_connection_get_bufferevent(evcon);
    auto found = self->heads_.find(bev);
    if (found != self->heads_.end()) {
      Head* head = found->second.get();
      if (head->stream != nullptr) self->StreamLost(evcon, head);
      if (head->linger) self->Linger(bev);
      evbuffer_remove_cb_entry(bufferevent_get_input(bev), head->on_input);
      evbuffer_remove_cb_entry(bufferevent_get_output(bev), head->on_output);
      self->heads_.erase(found);
    }
  }

  // ---- request heads, read before evhttp parses them (see the top of the file) ----

  // evhttp_set_bevcb: each accepted connection's bufferevent, with the callbacks on its buffers.
  static bufferevent* OnConnection(event_base* base, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    bufferevent* bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == nullptr) return nullptr;  // evhttp makes its own (without these answers)
    auto head = std::make_unique<Head>();
    head->worker = self;
    head->bev = bev;
    head->on_input = evbuffer_add_cb(bufferevent_get_input(bev), &Worker::OnInput, head.get());
    head->on_output = evbuffer_add_cb(bufferevent_get_output(bev), &Worker::OnOutput, head.get());
    // (an entry left by a connection that closed before sending anything is replaced here)
    self->heads_[bev] = std::move(head);
    return bev;
  }

  // Bytes arrived on a connection (before evhttp's read callback sees them).
  static void OnInput(evbuffer* input, const evbuffer_cb_info* info, void* arg) {
    Head* head = static_cast<Head*>(arg);
    if (info->n_added == 0 || head->refused || head->pulling) return;
    Worker* self = head->worker;
    if (head->evcon == nullptr) {  // the connection exists now: hear of its end
      // Responses go out at once, as tritonserver's (evhtp's EVHTP_FLAG_ENABLE_NODELAY): with
      // Nagle's algorithm the last partial segment of a response waited for the client's delayed
      // ACK (~40 ms a request for responses of 16-256 KB).
      int nodelay = 1;
      setsockopt(bufferevent_getfd(head->bev), IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
      void* evcon = nullptr;
      bufferevent_getcb(head->bev, nullptr, nullptr, nullptr, &evcon);
      head->evcon = static_cast<evhttp_connection*>(evcon);
      if (evcon != nullptr) evhttp_connection_set_closecb(head->evcon, &Worker::OnClose, self);
    }
    size_t length = evbuffer_get_length(input);
    size_t added = std::min<size_t>(info->n_added, length);
    if (head->skip > 0) {
      Skip(head, input);
      added = evbuffer_get_length(input);  // what is left is new, and the next head's
    }
    if (head->skip == 0 && head->expect && added > 0) {
      self->Read(head, input, evbuffer_get_length(input) - added);
    } else if (head->pull > 0) {  // libevent read more of the body
      head->pull -= std::min<uint64_t>(head->pull, added);
    }
    if (head->pull > 0 && !head->busy) PullBody(head, input);
  }

  // libevent 2.1 reads at most 4 KB per read event (EVBUFFER_MAX_READ), each read after an
  // ioctl(FIONREAD), and evhttp's read callback runs for each: a 600 KB image takes ~150 rounds.
  // Once a head with a declared body is read (and no answer before it is pending), the body's
  // rest is read here, in one recvmsg of what the socket holds, up to the declared size (at most
  // kMaxPull a time); evhttp then finds it in its input as if it had read it. No more than the
  // body is asked for: what came with the head and what libevent read itself are counted off.
  static constexpr uint64_t kMaxPull = 1 << 20;

  static void PullBody(Head* head, evbuffer* input) {
    int fd = bufferevent_getfd(head->bev);
    if (fd < 0) return;
    size_t want = static_cast<size_t>(std::min<uint64_t>(head->pull, kMaxPull));
    evbuffer_iovec space[2];
    int chunks = evbuffer_reserve_space(input, static_cast<ev_ssize_t>(want), space, 2);
    if (chunks <= 0) return;
    size_t room = 0;
    for (int i = 0; i < chunks; ++i) {
      if (space[i].iov_len > want - room) space[i].iov_len = want - room;
      room += space[i].iov_len;
    }
    msghdr message{};
    message.msg_iov = reinterpret_cast<iovec*>(space);  // (evbuffer_iovec is struct iovec's layout)
    message.msg_iovlen = static_cast<size_t>(chunks);
    ssize_t got = recvmsg(fd, &message, MSG_DONTWAIT);  // never waits: a client may wait for 100-continue
    if (got <= 0) {  // nothing yet (EAGAIN), or the end / an error: libevent's next read sees it
      evbuffer_commit_space(input, space, 0);
      return;
    }
    size_t left = static_cast<size_t>(got);
    int used = 0;
    for (; used < chunks && left > 0; ++used) {
      if (space[used].iov_len > left) space[used].iov_len = left;
      left -= space[used].iov_len;
    }
    head->pull -= static_cast<uint64_t>(got);
    head->pulling = true;  // (committing runs this buffer's callbacks: OnInput returns at once)
    evbuffer_commit_space(input, space, used);
    head->pulling = false;
  }

  // Copy the input from `from` on (new bytes of the coming head) and look for its end.
  void Read(Head* head, evbuffer* input, size_t from) {
    size_t room = kMaxHead + 4 > head->seen.size() ? kMaxHead + 4 - head->seen.size() : 0;
    size_t arrived = evbuffer_get_length(input) - from;
    size_t before = head->seen.size();
    size_t n = std::min(arrived, room);
    if (n > 0) {
      evbuffer_ptr at;
      evbuffer_ptr_set(input, &at, from, EVBUFFER_PTR_SET);
      size_t old = head->seen.size();
      head->seen.resize(old + n);
      ev_ssize_t got = evbuffer_copyout_from(input, &at, &head->seen[old], n);
      head->seen.resize(old + (got > 0 ? static_cast<size_t>(got) : 0));
    }
    size_t uncopied = arrived - (head->seen.size() - before);
    size_t tail = Inspect(head);
    if (head->pull > 0) {  // the head is read: what of its body came with it
      head->pull -= std::min<uint64_t>(head->pull, tail + uncopied);
    }
  }

  static void Skip(Head* head, evbuffer* input) {
    size_t n = std::min<uint64_t>(head->skip, evbuffer_get_length(input));
    evbuffer_drain(input, n);  // (this buffer's callbacks run again, with nothing added)
    head->skip -= n;
  }

  // evhttp handed over a request: what follows it on the connection is the next head (or the
  // rest of a body evhttp does not read).
  void NextHead(evhttp_connection* evcon, Req* req) {
    bufferevent* bev = evhttp_connection_get_bufferevent(evcon);
    auto found = heads_.find(bev);
    if (found == heads_.end()) return;
    Head* head = found->second.get();
    if (req->method == "UNKNOWN" && !head->method.empty()) req->method = head->method;
    head->method.clear();
    req->close = head->close_next;
    head->close_next = false;
    head->skip += head->body_left;
    head->body_left = 0;
    head->pull = 0;
    head->expect = true;
    head->busy = true;
    head->seen.clear();
    head->scanned = 0;
    evbuffer* input = bufferevent_get_input(bev);  // (evhttp reads none of it before the answer)
    if (head->skip > 0) Skip(head, input);
    if (head->skip == 0 && evbuffer_get_length(input) > 0) Read(head, input, 0);
  }

  // Looks for the head's end in what is `seen`; once found, parses the head and returns how many
  // of the bytes seen follow it (the start of its body).
  size_t Inspect(Head* head) {
    const std::string& text = head->seen;
    // the head ends at an empty line (CRLF or a bare LF, as evhttp reads lines)
    size_t end = std::string::npos;
    size_t start = head->scanned > 2 ? head->scanned - 2 : 0;
    head->scanned = text.size();
    for (size_t at = text.find('\n', start); at != std::string::npos; at = text.find('\n', at + 1)) {
      size_t next = at + 1;
      if (next < text.size() && text[next] == '\r') ++next;
      if (next < text.size() && text[next] == '\n') {
        end = next + 1;
        break;
      }
    }
    if (end == std::string::npos) {
      if (text.size() > kMaxHead) Done(head);  // evhttp refuses it (400)
      return 0;
    }
    size_t tail = text.size() - end;
    Parse(head, text.substr(0, end));
    Done(head);
    return tail;
  }

  static void Done(Head* head) {
    head->expect = false;
    if (head->seen.capacity() > 4096) {
      std::string().swap(head->seen);
    } else {
      head->seen.clear();
    }
    head->scanned = 0;
  }

  void Parse(Head* head, const std::string& text) {
    size_t end = text.size();
    size_t line_end = text.find('\n');
    std::string first = text.substr(0, line_end);
    std::string method = first.substr(0, first.find(' '));
    bool reads_body = true;
    bool known = KnownMethod(method, &reads_body);
    bool chunked = false, has_length = false, bad_length = false;
    uint64_t declared = 0;
    for (size_t at = line_end + 1; at < end;) {
      size_t stop = text.find('\n', at);
      size_t length = stop - at;
      if (length > 0 && text[at + length - 1] == '\r') --length;
      const char* line = text.data() + at;
      const char* colon = static_cast<const char*>(memchr(line, ':', length));
      if (colon != nullptr) {
        const char* value = colon + 1;
        const char* value_end = line + length;
        while (value < value_end && (*value == ' ' || *value == '\t')) ++value;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t')) --value_end;
        size_t name_size = static_cast<size_t>(colon - line);
        if (SameName(line, name_size, "transfer-encoding")) {
          chunked = chunked || SameName(value, static_cast<size_t>(value_end - value), "chunked");
        } else if (SameName(line, name_size, "content-length") && !has_length) {  // the first, as evhttp reads it
          has_length = true;
          uint64_t number = 0;
          bad_length = bad_length || value == value_end;
          for (const char* c = value; c < value_end; ++c) {
            if (*c < '0' || *c > '9' || number > (UINT64_MAX - 9) / 10) {
              bad_length = true;
              break;
            }
            number = number * 10 + static_cast<uint64_t>(*c - '0');
          }
          declared = number;
        }
      }
      at = stop + 1;
    }
    if (!chunked && has_length && !bad_length && declared > max_body_) {
      if (head->busy) {
        head->refuse = declared;  // pipelined behind a request not answered yet: after its answer
      } else {
        Refuse(head, declared);
      }
      return;
    }
    if (!known) head->method = method;
    if (!reads_body) {
      if (chunked) {
        head->close_next = true;
      } else if (has_length && !bad_length) {
        head->body_left = declared;
      }
    } else if (!chunked && has_length && !bad_length) {
      head->pull = declared;
    }
  }

  // A declared body over the limit: the JSON 413 now, before any of the body is read, straight
  // to the socket (nothing else is being written on it: evhttp reads a head only once the answer
  // before it is sent); then no more writes (evhttp reads and drops the body, and its own 413 goes
  // nowhere), and the connection ends.
  void Refuse(Head* head, uint64_t declared) {
    head->refused = true;
    std::string body = refusals_->declared_prefix + std::to_string(declared) + refusals_->declared_suffix;
    std::string answer = "HTTP/1.1 413 Request Entity Too Large\r\ncontent-type: application/json\r\n"
                         "connection: close\r\ncontent-length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    int fd = bufferevent_getfd(head->bev);
    if (fd < 0) return;
    ssize_t sent = send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)sent;  // a new connection's empty send buffer takes it whole
    shutdown(fd, SHUT_WR);
  }

  // Lingering close for an answer evhttp gave in the middle of a request (a chunked body over the
  // limit, a malformed request): evhttp closes the connection once its answer is written, and a
  // close with unread input resets it, which can take the answer from the client before it reads
  // it. Reading and dropping what still comes (for up to kLingerSeconds) keeps the connection
  // open until the client closes it; evhttp's shutdown(SHUT_WR) tells the client the answer is
  // complete. The worker's end closes what still lingers. The socket is taken from the
  // connection's bufferevent as evhttp frees it (it then closes nothing: the bufferevent holds no
  // descriptor, and evhttp closes its own only without BEV_OPT_CLOSE_ON_FREE, which ours have),
  // not copied: a copy would keep the closed descriptor's epoll entry alive (the constructor).
  static constexpr int kLingerSeconds = 10;

  struct Lingering {
    Worker* worker;
    int fd;
    event* ev;
  };

  void Linger(bufferevent* bev) {
    int fd = bufferevent_getfd(bev);
    if (fd < 0 || bufferevent_setfd(bev, -1) != 0) return;
    Lingering* lingering = new Lingering{this, fd, nullptr};
    lingering_.insert(lingering);
    lingering->ev = event_new(base_, fd, EV_READ | EV_PERSIST, &Worker::OnLinger, lingering);
    struct timeval tv = {kLingerSeconds, 0};
    if (lingering->ev == nullptr || event_add(lingering->ev, &tv) != 0) EndLinger(lingering);
  }

  static void EndLinger(Lingering* lingering) {
    lingering->worker->lingering_.erase(lingering);
    if (lingering->ev != nullptr) event_free(lingering->ev);
    close(lingering->fd);
    delete lingering;
  }

  void EndLingering() {
    while (!lingering_.empty()) EndLinger(*lingering_.begin());
  }

  static void OnLinger(evutil_socket_t fd, short what, void* arg) {
    Lingering* lingering = static_cast<Lingering*>(arg);
    if (what & EV_TIMEOUT) {
      EndLinger(lingering);
      return;
    }
    char scratch[16384];
    for (;;) {
      ssize_t got = recv(fd, scratch, sizeof scratch, 0);
      if (got > 0) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      EndLinger(lingering);  // the client closed (or the connection failed)
      return;
    }
  }

  // Something was written that Python did not answer: evhttp's own answer (or 100 Continue).
  static void OnOutput(evbuffer* output, const evbuffer_cb_info* info, void* arg) {
    Head* head = static_cast<Head*>(arg);
    Worker* self = head->worker;
    if (head->stream != nullptr) {  // a streamed answer's bytes came or went
      head->stream->buffered.store(static_cast<int64_t>(evbuffer_get_length(output)));
      self->Flow(head->stream);
    }
    if (info->n_added == 0 || self->writing_ || head->refused || head->fixup) return;
    head->fixup = true;  // once evhttp has written all of it (the socket is written on a later turn)
    self->fixups_.push_back(head->bev);
    event_active(self->fixup_, EV_READ, 0);
  }

  static void OnFixup(evutil_socket_t, short, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    std::vector<bufferevent*> fixups;
    fixups.swap(self->fixups_);
    for (bufferevent* bev : fixups) {
      auto found = self->heads_.find(bev);
      if (found == self->heads_.end() || !found->second->fixup) continue;  // closed meanwhile
      found->second->fixup = false;
      self->Rewrite(found->second.get());
    }
  }

  // evhttp's error page (`HTTP/1.1 413 ...`, text/html, `<HTML><HEAD>...`) -> the same status with
  // the JSON error body.
  void Rewrite(Head* head) {
    evbuffer* output = bufferevent_get_output(head->bev);
    // A socket bufferevent keeps its output's start frozen between writes once it has written
    // (it unfreezes it only to write): copying out or draining would fail on any connection that
    // was answered before (keep-alive, or a 100 Continue). Frozen again after, as it expects.
    evbuffer_unfreeze(output, 1);
    RewritePage(head, output);
    evbuffer_freeze(output, 1);
  }

  void RewritePage(Head* head, evbuffer* output) {
    size_t length = evbuffer_get_length(output);
    if (length < 16 || length > 8192) return;
    std::string text(length, '\0');
    if (evbuffer_copyout(output, &text[0], length) < 0) return;
    size_t split = text.find("\r\n\r\n");
    static const char kPage[] = "<HTML><HEAD>\n<TITLE>";
    if (text.compare(0, 7, "HTTP/1.") != 0 || split == std::string::npos ||
        text.compare(split + 4, sizeof kPage - 1, kPage) != 0) {
      return;
    }
    int code = atoi(text.c_str() + 9);
    size_t status_end = text.find("\r\n");
    std::string reason = text.substr(std::min(status_end, size_t{13}), status_end - std::min(status_end, size_t{13}));
    std::string body;
    if (code == 413) {
      body = refusals_->too_large;
    } else if (code == 400) {
      body = refusals_->bad_request;
    } else {
      body = "{\"error\":\"" + reason + "\"}";  // evhttp's reason phrases are plain ASCII words
    }
    std::string answer = text.substr(0, status_end + 2);
    for (size_t at = status_end + 2; at < split + 2;) {  // evhttp's headers but its type and length
      size_t stop = text.find("\r\n", at);
      const char* line = text.data() + at;
      size_t colon = text.find(':', at);
      size_t name_size = colon < stop ? colon - at : 0;
      if (!SameName(line, name_size, "content-type") && !SameName(line, name_size, "content-length")) {
        answer.append(text, at, stop + 2 - at);
      }
      at = stop + 2;
    }
    answer += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    head->linger = true;
    writing_ = true;
    evbuffer_drain(output, length);
    evbuffer_add(output, answer.data(), answer.size());
    writing_ = false;
  }

  // ---- a streamed answer's flow (see Req) ----

  Head* HeadOf(evhttp_connection* evcon) {
    if (evcon == nullptr) return nullptr;
    auto found = heads_.find(evhttp_connection_get_bufferevent(evcon));
    return found == heads_.end() ? nullptr : found->second.get();
  }

  // WRITABLE when what is outstanding fell to the mark Python waits for.
  void Flow(Req* req) {
    std::lock_guard<std::mutex> lock(req->flow_mu);
    if (req->want_writable && req->Outstanding() <= req->writable_at) {
      req->want_writable = false;
      req->Ref();
      hub_->Push(WRITABLE, req);
    }
  }

  static void MarkGone(Req* req) {
    std::lock_guard<std::mutex> lock(req->flow_mu);
    req->gone = true;
    req->want_writable = false;
  }

  void EndStream(Head* head, bool gone) {
    Req* req = head->stream;
    head->stream = nullptr;
    if (gone) MarkGone(req);
    req->Unref();
  }

  // evhttp closes a connection whose answer is still streaming (a failed write, a reader stalled
  // past the timeout, the worker's end): Python hears of it as of a client that left, so the
  // producer ends. evhttp keeps the request for the answer's end when it detached it, and frees
  // it with the connection otherwise.
  void StreamLost(evhttp_connection* evcon, Head* head) {
    Req* req = head->stream;
    head->stream = nullptr;
    MarkGone(req);
    if (req->watch != nullptr) {
      event_free(req->watch);
      req->watch = nullptr;
    }
    if (req->evreq != nullptr && evhttp_request_get_connection(req->evreq) == evcon) req->evreq = nullptr;
    hub_->Push(DISCONNECT, req);  // takes the stream's ref
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
    self->writing_ = true;  // what evhttp writes now is Python's answer
    for (Op& op : ops) {
      self->Apply(op);
      if (op.body != nullptr) evbuffer_free(op.body);
      op.req->Unref();
    }
    self->writing_ = false;
    if (stop_accepting && self->bound_ != nullptr && !self->unbinding_) {
      // first out of epoll (the change is made at the loop's next turn), then closed
      // (evhttp_del_accept_socket closes this worker's copy of the listening socket) on the turn
      // after: see the constructor
      self->unbinding_ = true;
      evconnlistener_disable(evhttp_bound_socket_get_listener(self->bound_));
      struct timeval now = {0, 0};
      if (event_base_once(self->base_, -1, EV_TIMEOUT, &Worker::OnUnbind, self, &now) != 0) OnUnbind(-1, 0, self);
    }
    if (finish) self->TryFinish();
  }

  static void OnUnbind(evutil_socket_t, short, void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    if (self->bound_ != nullptr && self->http_ != nullptr) evhttp_del_accept_socket(self->http_, self->bound_);
    self->bound_ = nullptr;
  }

  static void OnStopTimer(evutil_socket_t, short, void* arg) { static_cast<Worker*>(arg)->TryFinish(); }

  void TryFinish() {
    bool busy = false;
    std::vector<evhttp_connection*> idle;
    for (auto& entry : heads_) {
      Head* head = entry.second.get();
      if (head->evcon == nullptr) continue;  // nothing came on it (evhttp_free closes it)
      if (head->busy || evbuffer_get_length(bufferevent_get_output(head->bev)) > 0) {
        busy = true;  // a request with Python, or an answer not sent yet
      } else {
        idle.push_back(head->evcon);
      }
    }
    // idle keep-alive connections: closed now (a request arriving on one races the close, as
    // it does with any server that closes idle connections); OnClose forgets their heads
    for (evhttp_connection* evcon : idle) evhttp_connection_free(evcon);
    if (busy && std::chrono::steady_clock::now() < deadline_) {
      struct timeval tv = {0, 10000};
      evtimer_add(stop_timer_, &tv);
      return;
    }
    event_base_loopbreak(base_);
  }

  void Apply(Op& op) {
    evhttp_request* evreq = op.req->evreq;
    int64_t written = op.kind == Op::WRITE ? static_cast<int64_t>(evbuffer_get_length(op.body)) : 0;
    if (evreq == nullptr) {
      op.req->queued -= written;
      return;
    }
    bool final = op.kind == Op::REPLY || op.kind == Op::END;
    Head* head = op.req->started ? HeadOf(evhttp_request_get_connection(evreq)) : nullptr;  // (streams only)
    if (head != nullptr && head->stream == op.req && final) {
      EndStream(head, false);  // before evhttp ends the answer (it may free the connection at once)
    } else if (head != nullptr && head->stream == nullptr && op.kind == Op::START) {
      head->stream = op.req;  // from here its output counts (the head included)
      op.req->Ref();
    }
    if (op.kind == Op::REPLY || op.kind == Op::START) {
      evkeyvalq* out = evhttp_request_get_output_headers(evreq);
      for (auto& header : op.headers) evhttp_add_header(out, header.first.c_str(), header.second.c_str());
      if (op.close || op.req->close) {
        evhttp_remove_header(out, "Connection");
        evhttp_add_header(out, "Connection", "close");
      }
    }
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
        if (written > 0) evhttp_send_reply_chunk(evreq, op.body);
        op.req->queued -= written;
        Flow(op.req);
        break;
      case Op::END:
        evhttp_send_reply_end(evreq);
        break;
    }
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
  uint64_t max_body_;
  const Refusals* refusals_;
  event* fixup_ = nullptr;
  bool writing_ = false;
  std::vector<bufferevent*> fixups_;
  std::unordered_map<bufferevent*, std::unique_ptr<Head>> heads_;  // worker thread only
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  evhttp_bound_socket* bound_ = nullptr;
  bool unbinding_ = false;
  event* wake_ = nullptr;
  event* stop_timer_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Op> ops_;
  bool stop_accepting_ = false;
  bool finish_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::unordered_set<Lingering*> lingering_;  // worker thread only
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
  frontend::FreeInstance(reinterpret_cast<PyObject*>(self));
}

bool ParseHeaders(PyObject* headers, std::vector<std::pair<std::string, std::string>>* out) {
  PyObject* seq = PySequence_Fast(headers, "headers must be a sequence of (name, value) pairs");
  if (seq == nullptr) return false;
  Py_ssize_t n = PySequence_Size(seq);
  out->reserve(static_cast<size_t>(n < 0 ? 0 : n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PySequence_GetItem(seq, i);  // a list or tuple (PySequence_Fast): cannot fail
    const char* name;
    const char* value;
    Py_ssize_t name_len, value_len;
    bool parsed = pair != nullptr && PyArg_ParseTuple(pair, "y#y#", &name, &name_len, &value, &value_len);
    if (parsed && (memchr(name, '\n', name_len) || memchr(name, '\r', name_len) || memchr(value, '\n', value_len) ||
                   memchr(value, '\r', value_len))) {
      PyErr_SetString(PyExc_ValueError, "a header name or value holds a line break");
      parsed = false;
    }
    if (parsed) out->emplace_back(std::string(name, name_len), std::string(value, value_len));
    Py_XDECREF(pair);  // (name and value point into it: copied above)
    if (!parsed) {
      Py_DECREF(seq);
      return false;
    }
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
  int64_t size = static_cast<int64_t>(body.len);
  op.body = BufferOf(body.buf, static_cast<size_t>(size));
  PyBuffer_Release(&body);
  if (op.body == nullptr) return PyErr_NoMemory();
  self->req->queued += size;
  self->req->Ref();
  self->req->worker->Push(std::move(op));
  return PyLong_FromLongLong(self->req->Outstanding());
}

// wait_writable(low): True when more than `low` bytes are outstanding: a WRITABLE event follows
// once no more than that are (drain() gives ("writable", id)); False when there is no need to
// wait (that many or fewer are, or the client is gone: its DISCONNECT came or comes).
PyObject* PyReq_wait_writable(PyReq* self, PyObject* arg) {
  long long low = PyLong_AsLongLong(arg);
  if (low == -1 && PyErr_Occurred()) return nullptr;
  Req* req = self->req;
  std::lock_guard<std::mutex> lock(req->flow_mu);
  if (req->gone || req->Outstanding() <= low) Py_RETURN_FALSE;
  req->want_writable = true;
  req->writable_at = low;
  Py_RETURN_TRUE;
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
  if (length > 0) evbuffer_remove(body, PyBytes_AsString(bytes), length);
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
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), item);  // steals `item`
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
    {"write", reinterpret_cast<PyCFunction>(PyReq_write), METH_O,
     "write(data): one piece of a streamed response; returns the bytes written and not yet taken by the kernel."},
    {"wait_writable", reinterpret_cast<PyCFunction>(PyReq_wait_writable), METH_O,
     "wait_writable(low): True when more than low bytes are outstanding: drain() gives ('writable', id) once "
     "no more than low are; False when there is no need to wait."},
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

PyType_Slot PyReq_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(PyReq_dealloc)},
    {Py_tp_methods, PyReq_methods},
    {Py_tp_getset, PyReq_getset},
    {Py_tp_doc, const_cast<char*>("One HTTP request (made by Server.drain).")},
    {0, nullptr},
};

PyType_Spec PyReq_spec = {"_httpnative.Request", sizeof(PyReq), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, PyReq_slots};

PyTypeObject* PyReqType = nullptr;  // made at import (frontend::AddType)

struct PyServer {
  PyObject_HEAD
  Hub* hub;
  std::vector<Worker*>* workers;
  bool finished;
};

int PyServer_init(PyServer* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"fd", "max_body", "threads", "timeout", "declared_prefix", "declared_suffix",
                                   "too_large", "bad_request", nullptr};
  int fd, threads;
  long long max_body;
  double timeout;
  const char *prefix, *suffix, *too_large, *bad_request;
  Py_ssize_t prefix_len, suffix_len, too_large_len, bad_request_len;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iLidy#y#y#y#", const_cast<char**>(keywords), &fd, &max_body,
                                   &threads, &timeout, &prefix, &prefix_len, &suffix, &suffix_len, &too_large,
                                   &too_large_len, &bad_request, &bad_request_len)) {
    return -1;
  }
  if (self->workers != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "already initialised");
    return -1;
  }
  if (threads < 1) threads = 1;
  self->hub = new Hub();
  Refusals* refusals = new Refusals();  // (kept with the workers, which are never freed)
  refusals->declared_prefix.assign(prefix, static_cast<size_t>(prefix_len));
  refusals->declared_suffix.assign(suffix, static_cast<size_t>(suffix_len));
  refusals->too_large.assign(too_large, static_cast<size_t>(too_large_len));
  refusals->bad_request.assign(bad_request, static_cast<size_t>(bad_request_len));
  self->workers = new std::vector<Worker*>();
  for (int i = 0; i < threads; ++i) {
    int own = dup(fd);
    if (own < 0) {
      PyErr_SetFromErrno(PyExc_OSError);
      return -1;
    }
    evutil_make_socket_nonblocking(own);  // the accept loop reads until EAGAIN (shared by every copy)
    Worker* worker = new Worker(self->hub, own, max_body, timeout, refusals);
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
      PyReq* wrapped = PyObject_New(PyReq, PyReqType);
      if (wrapped == nullptr) {
        event.req->Unref();
        return nullptr;
      }
      wrapped->req = event.req;  // takes the queue's ref
      return reinterpret_cast<PyObject*>(wrapped);
    }
    PyObject* id = PyLong_FromUnsignedLongLong(event.req->id);
    event.req->Unref();
    if (id == nullptr || event.kind == DISCONNECT) return id;  // DISCONNECT: the request's id
    PyObject* writable = Py_BuildValue("(sN)", "writable", id);  // WRITABLE: ("writable", id)
    return writable;
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
  frontend::FreeInstance(reinterpret_cast<PyObject*>(self));
}

PyMethodDef PyServer_methods[] = {
    {"drain", reinterpret_cast<PyCFunction>(PyServer_drain), METH_NOARGS,
     "Take every pending event: a list of Request (a new request), int (the id of a request whose client closed "
     "the connection before its answer ended) and ('writable', id) (a streamed answer that waited may go on)."},
    {"stop_accepting", reinterpret_cast<PyCFunction>(PyServer_stop_accepting), METH_NOARGS,
     "Stop accepting connections (the listening socket stays open until Python closes it)."},
    {"shutdown", reinterpret_cast<PyCFunction>(PyServer_shutdown), METH_VARARGS,
     "shutdown(grace): stop accepting, close idle connections, wait up to grace seconds for the "
     "answers in flight to be written, then close the rest (blocks; call it off the event loop)."},
    {"fileno", reinterpret_cast<PyCFunction>(PyServer_fileno), METH_NOARGS,
     "The eventfd that is readable while requests wait."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot PyServer_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(PyServer_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(PyServer_dealloc)},
    {Py_tp_methods, PyServer_methods},
    {Py_tp_doc, const_cast<char*>(
        "Server(fd, max_body, threads, timeout, declared_prefix, declared_suffix, too_large, bad_request): serve "
        "HTTP on the listening socket `fd` (duplicated; the caller keeps and closes its own) with `threads` "
        "libevent threads, closing connections idle for `timeout` seconds. The bytes are the JSON bodies of the "
        "answers given without Python: 413 for a declared body over max_body (prefix + its size + suffix), 413 "
        "for a chunked one, 400 for a malformed request.")},
    {0, nullptr},
};

PyType_Spec PyServer_spec = {"_httpnative.Server", sizeof(PyServer), 0, Py_TPFLAGS_DEFAULT, PyServer_slots};


PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_httpnative",
                          "libevent (evhttp) front end that hands complete HTTP requests to Python.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__httpnative(void) {
  if (evthread_use_pthreads() != 0) {
    PyErr_SetString(PyExc_ImportError, "libevent has no pthreads support");
    return nullptr;
  }
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  if (!frontend::AddType(module, &PyServer_spec, "Server") ||
      !frontend::AddType(module, &PyReq_spec, "Request", &PyReqType)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
