// A gRPC front end for Python built on grpc++'s callback generic service.
//
// grpc++'s own threads accept connections, speak HTTP/2 and gRPC, and receive every RPC as raw
// bytes (no protobuf parsing here: the Python side parses with the kept generated modules).
// Each event (a request message, the client's half-close, a cancellation) is put on one queue;
// an eventfd becomes readable when the queue goes from empty to non-empty, and the asyncio loop
// takes the whole queue in one call (`Server.drain`). Python answers through the `Call` object
// (`reply`, `write`, `finish`, `read`), which hands the bytes to grpc++ and returns at once.
//
// grpc++'s threads never touch Python objects and never take the GIL. Python's answers go to
// grpc++ through one sender thread (starting a write runs transport work inline: ~30 us per
// unary reply measured on the loop's thread, ~4 us to queue it instead). The only blocking call,
// `Server.shutdown`, runs without the GIL.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <atomic>
#include <condition_variable>
#include <thread>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "frontend.h"  // handlers/protocol/native: the queue to the asyncio loop

namespace {

enum EventKind { MESSAGE = 0, HALF_CLOSE = 1, CANCELLED = 2, WRITABLE = 3 };

class Hub;
struct PyCall;

// One RPC. Owned jointly (refs): grpc++ until OnDone, each queued event, the Python object.
class Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(Hub* hub, grpc::GenericCallbackServerContext* context);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Python side (GIL held; never blocks).
  void Write(grpc::ByteBuffer buffer);
  void Reply(grpc::ByteBuffer buffer);  // write one message and finish with OK
  void Finish(grpc::Status status);
  void Read();  // ask for the next message (after the first, which is read at once)

  Hub* hub_;
  std::string method_;
  std::string peer_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::chrono::system_clock::time_point deadline_;
  PyCall* py_ = nullptr;  // the Python object, touched only with the GIL held
  std::atomic<bool> cancelled_{false};

  // Flow control of response messages: `submitted_` counts `write`s (Python thread, GIL held),
  // `completed_` those grpc++ finished or dropped; WRITABLE is pushed once pending falls to
  // `writable_at_` after Python asked (WaitWritable).
  int64_t submitted_ = 0;
  std::atomic<int64_t> completed_{0};
  bool WaitWritable(int64_t at);
  int64_t Submit() {  // one more write; returns the messages not sent yet
    std::lock_guard<std::mutex> lock(mu_);
    return ++submitted_ - completed_.load();
  }

 private:
  ~Call() override = default;
  void StartNextWrite(std::unique_lock<std::mutex>& lock);

  std::atomic<int> refs_{1};
  grpc::ByteBuffer request_;
  std::mutex mu_;
  std::deque<grpc::ByteBuffer> writes_;  // front is in flight while writing_
  bool writing_ = false;
  bool finish_wanted_ = false;
  bool finish_sent_ = false;
  bool done_ = false;
  bool read_closed_ = false;
  bool want_writable_ = false;
  int64_t writable_at_ = 0;
  grpc::Status status_;
  void Completed(int64_t count);  // mu_ held
};

struct Event {
  Call* call;  // holds a ref
  int kind;
  grpc::ByteBuffer payload;

  Event(Call* c, int k) : call(c), kind(k) {}
  Event(Event&& other) noexcept : call(other.call), kind(other.kind) { payload.Swap(&other.payload); }
};

// The queue between grpc++'s threads and the asyncio loop.
class Hub {
 public:
  void Push(Call* call, int kind, grpc::ByteBuffer* payload) {
    call->Ref();
    Event event(call, kind);
    if (payload != nullptr) event.payload.Swap(payload);
    queue.Push(std::move(event));
  }

  frontend::EventQueue<Event> queue;
};

// Python's answers, handed to grpc++ on this thread: starting a write or a finish runs part of
// grpc's transport work inline (measured ~30 us per unary reply), which must not be the GIL's.
class Sender {
 public:
  enum Kind { WRITE, REPLY, FINISH, READ };
  struct Op {
    Call* call;  // holds a ref
    Kind kind;
    grpc::ByteBuffer buffer;
    grpc::Status status;
  };

  Sender() : thread_([this] { Run(); }) { thread_.detach(); }

  void Push(Call* call, Kind kind, grpc::ByteBuffer* buffer, grpc::Status status = grpc::Status::OK) {
    call->Ref();
    std::lock_guard<std::mutex> lock(mu_);
    bool was_empty = ops_.empty();
    ops_.push_back(Op{call, kind, grpc::ByteBuffer(), std::move(status)});
    if (buffer != nullptr) ops_.back().buffer.Swap(buffer);
    if (was_empty) ready_.notify_one();
  }

 private:
  void Run() {
    std::vector<Op> ops;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        ready_.wait(lock, [this] { return !ops_.empty(); });
        ops.swap(ops_);
      }
      for (Op& op : ops) {
        switch (op.kind) {
          case WRITE: op.call->Write(std::move(op.buffer)); break;
          case REPLY: op.call->Reply(std::move(op.buffer)); break;
          case FINISH: op.call->Finish(std::move(op.status)); break;
          case READ: op.call->Read(); break;
        }
        op.call->Unref();
      }
      ops.clear();
    }
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::vector<Op> ops_;
  std::thread thread_;
};

Sender* TheSender() {
  static Sender* sender = new Sender();  // one per process, never destroyed
  return sender;
}

Call::Call(Hub* hub, grpc::GenericCallbackServerContext* context)
    : hub_(hub), method_(context->method()), peer_(context->peer()), deadline_(context->deadline()) {
  for (const auto& entry : context->client_metadata()) {
    metadata_.emplace_back(std::string(entry.first.data(), entry.first.size()),
                           std::string(entry.second.data(), entry.second.size()));
  }
  StartRead(&request_);
}

void Call::OnReadDone(bool ok) {
  if (ok) {
    hub_->Push(this, MESSAGE, &request_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    read_closed_ = true;
  }
  hub_->Push(this, HALF_CLOSE, nullptr);  // the client sent its last message (or none at all)
}

void Call::Read() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || finish_sent_ || finish_wanted_ || read_closed_) return;
  }
  // Not under mu_: grpc++ may run OnReadDone inline, which takes it. Nothing can finish the call
  // meanwhile: Python's finish comes through this same sender thread, and a finish left to
  // OnWriteDone (finish_wanted_) was refused above. No reaction is pending on request_ (the
  // previous read's was delivered), so it is free.
  StartRead(&request_);
}

void Call::StartNextWrite(std::unique_lock<std::mutex>& lock) {
  // mu_ held, writing_ false, writes_ non-empty
  writing_ = true;
  const grpc::ByteBuffer* next = &writes_.front();
  lock.unlock();
  StartWrite(next);
}

void Call::Completed(int64_t count) {
  int64_t completed = completed_.fetch_add(count) + count;
  if (want_writable_ && submitted_ - completed <= writable_at_) {
    want_writable_ = false;
    hub_->Push(this, WRITABLE, nullptr);
  }
}

bool Call::WaitWritable(int64_t at) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ || submitted_ - completed_.load() <= at) return false;
  want_writable_ = true;
  writable_at_ = at;
  return true;
}

void Call::Write(grpc::ByteBuffer buffer) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || finish_sent_ || finish_wanted_) {
    Completed(1);
    return;
  }
  writes_.push_back(std::move(buffer));
  if (!writing_) StartNextWrite(lock);
}

void Call::Reply(grpc::ByteBuffer buffer) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || finish_sent_ || finish_wanted_) return;
  if (writing_) {
    writes_.push_back(std::move(buffer));
    finish_wanted_ = true;
    status_ = grpc::Status::OK;
    return;
  }
  finish_sent_ = true;
  writes_.push_back(std::move(buffer));
  const grpc::ByteBuffer* last = &writes_.front();
  lock.unlock();
  StartWriteAndFinish(last, grpc::WriteOptions(), grpc::Status::OK);
}

void Call::Finish(grpc::Status status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || finish_sent_ || finish_wanted_) return;
  if (writing_) {
    finish_wanted_ = true;
    status_ = std::move(status);
    return;
  }
  finish_sent_ = true;
  lock.unlock();
  grpc::ServerGenericBidiReactor::Finish(std::move(status));
}

void Call::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writes_.pop_front();
  writing_ = false;
  int64_t completed = 1;
  if (!ok) {  // the stream is broken (cancelled): nothing more can be written
    completed += static_cast<int64_t>(writes_.size());
    writes_.clear();
  }
  Completed(completed);
  if (!writes_.empty()) {
    if (finish_wanted_ && writes_.size() == 1) {  // the last message goes with the status
      finish_sent_ = true;
      const grpc::ByteBuffer* last = &writes_.front();
      grpc::Status status = std::move(status_);
      lock.unlock();
      StartWriteAndFinish(last, grpc::WriteOptions(), std::move(status));
      return;
    }
    StartNextWrite(lock);
    return;
  }
  if (finish_wanted_ && !finish_sent_) {
    finish_sent_ = true;
    grpc::Status status = std::move(status_);
    lock.unlock();
    grpc::ServerGenericBidiReactor::Finish(std::move(status));
  }
}

void Call::OnCancel() {
  cancelled_.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_sent_) return;
  }
  hub_->Push(this, CANCELLED, nullptr);
}

void Call::OnDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    writes_.clear();
    if (want_writable_) {  // nothing more will be written: let the writer go on (and end)
      want_writable_ = false;
      hub_->Push(this, WRITABLE, nullptr);
    }
  }
  Unref();
}

class Service final : public grpc::CallbackGenericService {
 public:
  explicit Service(Hub* hub) : hub_(hub) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    return new Call(hub_, context);
  }

 private:
  Hub* hub_;
};

// ---------------------------------------------------------------- Python objects

PyObject* MakeBytes(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return PyBytes_FromStringAndSize(nullptr, 0);
  if (slices.size() == 1) {
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size());
  }
  size_t total = 0;
  for (const auto& slice : slices) total += slice.size();
  PyObject* bytes = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(total));
  if (bytes == nullptr) return nullptr;
  char* out = PyBytes_AsString(bytes);
  for (const auto& slice : slices) {
    memcpy(out, slice.begin(), slice.size());
    out += slice.size();
  }
  return bytes;
}

bool ToBuffer(PyObject* data, grpc::ByteBuffer* out) {
  Py_buffer view;
  if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0) return false;
  grpc::Slice slice(view.buf, static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  grpc::ByteBuffer buffer(&slice, 1);
  out->Swap(&buffer);
  return true;
}

struct PyCall {
  PyObject_HEAD
  Call* call;
  PyObject* tag;
  PyObject* method;
};

void PyCall_dealloc(PyCall* self) {
  PyObject_GC_UnTrack(reinterpret_cast<PyObject*>(self));
  Py_CLEAR(self->tag);
  Py_CLEAR(self->method);
  if (self->call != nullptr) {
    self->call->py_ = nullptr;
    self->call->Unref();
    self->call = nullptr;
  }
  frontend::FreeInstance(reinterpret_cast<PyObject*>(self));
}

int PyCall_traverse(PyCall* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(reinterpret_cast<PyObject*>(self)));  // a heap type's instances own a reference to it
  Py_VISIT(self->tag);
  return 0;
}

int PyCall_clear(PyCall* self) {
  Py_CLEAR(self->tag);
  return 0;
}

PyObject* PyCall_write(PyCall* self, PyObject* data) {
  grpc::ByteBuffer buffer;
  if (!ToBuffer(data, &buffer)) return nullptr;
  int64_t pending = self->call->Submit();
  TheSender()->Push(self->call, Sender::WRITE, &buffer);
  return PyLong_FromLongLong(pending);
}

PyObject* PyCall_reply(PyCall* self, PyObject* data) {
  grpc::ByteBuffer buffer;
  if (!ToBuffer(data, &buffer)) return nullptr;
  TheSender()->Push(self->call, Sender::REPLY, &buffer);
  Py_RETURN_NONE;
}

PyObject* PyCall_finish(PyCall* self, PyObject* args) {
  int code;
  const char* message;
  Py_ssize_t length;
  if (!PyArg_ParseTuple(args, "is#", &code, &message, &length)) return nullptr;
  TheSender()->Push(self->call, Sender::FINISH, nullptr,
                    grpc::Status(static_cast<grpc::StatusCode>(code), std::string(message, length)));
  Py_RETURN_NONE;
}

PyObject* PyCall_read(PyCall* self, PyObject*) {
  TheSender()->Push(self->call, Sender::READ, nullptr);
  Py_RETURN_NONE;
}

PyObject* PyCall_metadata(PyCall* self, PyObject*) {
  const auto& metadata = self->call->metadata_;
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(metadata.size()));
  if (result == nullptr) return nullptr;
  for (size_t i = 0; i < metadata.size(); ++i) {
    const auto& key = metadata[i].first;
    const auto& value = metadata[i].second;
    PyObject* v;
    if (key.size() > 4 && key.compare(key.size() - 4, 4, "-bin") == 0) {
      v = PyBytes_FromStringAndSize(value.data(), static_cast<Py_ssize_t>(value.size()));
    } else {
      v = PyUnicode_DecodeLatin1(value.data(), static_cast<Py_ssize_t>(value.size()), nullptr);
    }
    PyObject* pair = v == nullptr ? nullptr : Py_BuildValue("(s#N)", key.data(), (Py_ssize_t)key.size(), v);
    if (pair == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SetItem(result, static_cast<Py_ssize_t>(i), pair);  // steals `pair`
  }
  return result;
}

PyObject* PyCall_peer(PyCall* self, PyObject*) {
  return PyUnicode_FromStringAndSize(self->call->peer_.data(), static_cast<Py_ssize_t>(self->call->peer_.size()));
}

PyObject* PyCall_time_remaining(PyCall* self, PyObject*) {
  auto deadline = self->call->deadline_;
  if (deadline == std::chrono::system_clock::time_point::max()) Py_RETURN_NONE;
  std::chrono::duration<double> left = deadline - std::chrono::system_clock::now();
  double seconds = left.count();
  if (seconds > 1e9) Py_RETURN_NONE;  // grpc's "infinite future"
  return PyFloat_FromDouble(seconds < 0 ? 0.0 : seconds);
}

PyObject* PyCall_wait_writable(PyCall* self, PyObject* arg) {
  long long at = PyLong_AsLongLong(arg);
  if (at == -1 && PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(self->call->WaitWritable(at) ? 1 : 0);
}

PyObject* PyCall_cancelled(PyCall* self, PyObject*) {
  return PyBool_FromLong(self->call->cancelled_.load() ? 1 : 0);
}

PyObject* PyCall_get_method(PyCall* self, void*) {
  if (self->method == nullptr) {
    const std::string& method = self->call->method_;
    self->method = PyUnicode_FromStringAndSize(method.data(), static_cast<Py_ssize_t>(method.size()));
    if (self->method == nullptr) return nullptr;
  }
  Py_INCREF(self->method);
  return self->method;
}

PyMethodDef PyCall_methods[] = {
    {"write", reinterpret_cast<PyCFunction>(PyCall_write), METH_O,
     "Send one response message; returns how many written messages are not sent yet."},
    {"wait_writable", reinterpret_cast<PyCFunction>(PyCall_wait_writable), METH_O,
     "wait_writable(n): True when more than n messages are not sent yet: a WRITABLE event follows "
     "once no more than n are (or the call ends)."},
    {"reply", reinterpret_cast<PyCFunction>(PyCall_reply), METH_O,
     "Send one response message and finish with OK."},
    {"finish", reinterpret_cast<PyCFunction>(PyCall_finish), METH_VARARGS,
     "finish(code, message): end the RPC with a status (after the messages already written)."},
    {"read", reinterpret_cast<PyCFunction>(PyCall_read), METH_NOARGS,
     "Ask for the next request message (the first is read at once; HALF_CLOSE follows the last)."},
    {"metadata", reinterpret_cast<PyCFunction>(PyCall_metadata), METH_NOARGS,
     "The client's metadata: a tuple of (key, value)."},
    {"peer", reinterpret_cast<PyCFunction>(PyCall_peer), METH_NOARGS, "The client's address."},
    {"time_remaining", reinterpret_cast<PyCFunction>(PyCall_time_remaining), METH_NOARGS,
     "Seconds left before the client's deadline, None without one."},
    {"cancelled", reinterpret_cast<PyCFunction>(PyCall_cancelled), METH_NOARGS,
     "Whether the RPC was cancelled."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef PyCall_members[] = {
    {"tag", T_OBJECT, offsetof(PyCall, tag), 0, "Free for the Python side's per-call state."},
    {nullptr, 0, 0, 0, nullptr},
};

PyGetSetDef PyCall_getset[] = {
    {"method", reinterpret_cast<getter>(PyCall_get_method), nullptr, "The RPC's full method name.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot PyCall_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(PyCall_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(PyCall_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(PyCall_clear)},
    {Py_tp_methods, PyCall_methods},
    {Py_tp_members, PyCall_members},
    {Py_tp_getset, PyCall_getset},
    {Py_tp_doc, const_cast<char*>("One gRPC call (made by Server.drain).")},
    {0, nullptr},
};

PyType_Spec PyCall_spec = {"_grpcnative.Call", sizeof(PyCall), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, PyCall_slots};

PyTypeObject* PyCallType = nullptr;  // made at import (frontend::AddType)

PyObject* WrapCall(Call* call) {
  if (call->py_ != nullptr) {
    Py_INCREF(reinterpret_cast<PyObject*>(call->py_));
    return reinterpret_cast<PyObject*>(call->py_);
  }
  PyCall* object = PyObject_GC_New(PyCall, PyCallType);
  if (object == nullptr) return nullptr;
  call->Ref();
  object->call = call;
  object->tag = nullptr;
  object->method = nullptr;
  call->py_ = object;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(object));
  return reinterpret_cast<PyObject*>(object);
}

struct PyServer {
  PyObject_HEAD
  Hub* hub;
  Service* service;
  grpc::Server* server;
  int port;
};

int PyServer_init(PyServer* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"address", "max_receive", "max_send", "reuse_port", nullptr};
  const char* address;
  int max_receive, max_send, reuse_port;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "siip", const_cast<char**>(keywords), &address, &max_receive,
                                   &max_send, &reuse_port)) {
    return -1;
  }
  if (self->server != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "already initialised");
    return -1;
  }
  self->hub = new Hub();
  self->service = new Service(self->hub);
  std::string where(address);
  int port = 0;
  grpc::Server* server = nullptr;
  Py_BEGIN_ALLOW_THREADS
  grpc::ServerBuilder builder;
  builder.AddListeningPort(where, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(max_receive);
  builder.SetMaxSendMessageSize(max_send);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  builder.RegisterCallbackGenericService(self->service);
  server = builder.BuildAndStart().release();
  Py_END_ALLOW_THREADS
  if (server == nullptr || port == 0) {
    delete server;
    PyErr_Format(PyExc_OSError, "cannot listen for gRPC on %s: the address is in use or unavailable", address);
    return -1;
  }
  self->server = server;
  self->port = port;
  return 0;
}

PyObject* PyServer_drain(PyServer* self, PyObject*) {
  auto wrap = [](Event& event) -> PyObject* {
    PyObject* call = WrapCall(event.call);
    PyObject* payload;
    if (event.kind == MESSAGE) {
      payload = MakeBytes(event.payload);
    } else {
      payload = Py_None;
      Py_INCREF(payload);
    }
    event.call->Unref();
    if (call == nullptr || payload == nullptr) {
      Py_XDECREF(call);
      Py_XDECREF(payload);
      return nullptr;
    }
    return Py_BuildValue("(NiN)", call, event.kind, payload);
  };
  return frontend::DrainList(self->hub->queue, wrap, [](Event& event) { event.call->Unref(); });
}

PyObject* PyServer_shutdown(PyServer* self, PyObject* args) {
  double grace;
  if (!PyArg_ParseTuple(args, "d", &grace)) return nullptr;
  grpc::Server* server = self->server;
  if (server == nullptr) Py_RETURN_NONE;
  Py_BEGIN_ALLOW_THREADS
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::microseconds(static_cast<int64_t>(grace * 1e6));
  server->Shutdown(deadline);
  server->Wait();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* PyServer_fileno(PyServer* self, PyObject*) { return PyLong_FromLong(self->hub->queue.fd()); }

void PyServer_dealloc(PyServer* self) {
  if (self->server != nullptr) {
    Py_BEGIN_ALLOW_THREADS
    self->server->Shutdown(std::chrono::system_clock::now());
    self->server->Wait();
    delete self->server;
    Py_END_ALLOW_THREADS
  }
  if (self->hub != nullptr) {
    for (Event& event : self->hub->queue.Take()) event.call->Unref();
  }
  // the service and hub are leaked on purpose when calls may still reference them (never freed
  // before the server: a server is made once per process)
  frontend::FreeInstance(reinterpret_cast<PyObject*>(self));
}

PyMethodDef PyServer_methods[] = {
    {"drain", reinterpret_cast<PyCFunction>(PyServer_drain), METH_NOARGS,
     "Take every pending event: a list of (call, kind, payload)."},
    {"shutdown", reinterpret_cast<PyCFunction>(PyServer_shutdown), METH_VARARGS,
     "shutdown(grace): refuse new RPCs, wait up to grace seconds for the others, cancel the rest "
     "(blocks; call it off the event loop)."},
    {"fileno", reinterpret_cast<PyCFunction>(PyServer_fileno), METH_NOARGS,
     "The eventfd that is readable while events wait."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef PyServer_members[] = {
    {"port", T_INT, offsetof(PyServer, port), READONLY, "The bound port."},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot PyServer_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_init, reinterpret_cast<void*>(PyServer_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(PyServer_dealloc)},
    {Py_tp_methods, PyServer_methods},
    {Py_tp_members, PyServer_members},
    {Py_tp_doc, const_cast<char*>("Server(address, max_receive, max_send, reuse_port): listen and start; "
                                  "`port` is the bound port.")},
    {0, nullptr},
};

PyType_Spec PyServer_spec = {"_grpcnative.Server", sizeof(PyServer), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                             PyServer_slots};


PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_grpcnative",
                          "grpc++ front end that hands raw gRPC calls to Python.", -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__grpcnative(void) {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  if (!frontend::AddType(module, &PyServer_spec, "Server") ||
      !frontend::AddType(module, &PyCall_spec, "Call", &PyCallType)) {
    Py_DECREF(module);
    return nullptr;
  }
  PyModule_AddIntConstant(module, "MESSAGE", MESSAGE);
  PyModule_AddIntConstant(module, "HALF_CLOSE", HALF_CLOSE);
  PyModule_AddIntConstant(module, "CANCELLED", CANCELLED);
  PyModule_AddIntConstant(module, "WRITABLE", WRITABLE);
  return module;
}
