// What the native front ends (handlers/protocol/grpc/native/grpcnative.cpp,
// handlers/protocol/httpnative/native/httpnative.cpp) share: the queue that hands their threads'
// work to the asyncio loop, and the Python side of taking it.
//
// The front end's threads push events onto one queue; an eventfd becomes readable when the queue
// goes from empty to non-empty, and the asyncio loop takes the whole queue in one call
// (`Server.drain`), so a burst of requests costs one wake-up and one call.
//
// Both modules are built against CPython's stable ABI (the limited API of 3.11: build.py defines
// Py_LIMITED_API), so one build serves every CPython from 3.11 on: a wheel made with the Python
// that runs `toolkit build` fits an image with another one (an `abi3` wheel). Their types are
// therefore heap types made from a PyType_Spec (`AddType`), whose instances hold a reference to
// their type (`FreeInstance` drops it).

#ifndef TOOLKIT_NATIVE_FRONTEND_H_
#define TOOLKIT_NATIVE_FRONTEND_H_

#if !defined(Py_LIMITED_API) || Py_LIMITED_API < 0x030B0000
#error "build against the stable ABI: -DPy_LIMITED_API=0x030B0000 (handlers/protocol/native/build.py does)"
#endif

#include <Python.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace frontend {

// The queue between a front end's threads and the asyncio loop. `Event` must be movable.
template <typename Event>
class EventQueue {
 public:
  EventQueue() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~EventQueue() {
    if (fd_ >= 0) close(fd_);
  }
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  // Any thread.
  void Push(Event event) {
    std::lock_guard<std::mutex> lock(mu_);
    bool was_empty = events_.empty();
    events_.push_back(std::move(event));
    if (was_empty) {
      uint64_t one = 1;
      ssize_t written = write(fd_, &one, sizeof one);
      (void)written;
    }
  }

  // Everything queued (the eventfd is set iff the queue was non-empty: reading it resets it).
  std::vector<Event> Take() {
    std::vector<Event> taken;
    std::lock_guard<std::mutex> lock(mu_);
    taken.swap(events_);
    uint64_t count;
    ssize_t got = read(fd_, &count, sizeof count);
    (void)got;
    return taken;
  }

  int fd() const { return fd_; }

 private:
  int fd_;
  std::mutex mu_;
  std::vector<Event> events_;
};

// `Server.drain()`: every queued event as a Python list. `wrap(event)` takes the event over and
// makes its item (a new reference; nullptr with a Python error set when it cannot, the event
// released all the same). Should one fail, the list is dropped, the error stands, and
// `drop(event)` releases each event not wrapped yet. GIL held.
template <typename Event, typename Wrap, typename Drop>
PyObject* DrainList(EventQueue<Event>& queue, Wrap wrap, Drop drop) {
  std::vector<Event> events = queue.Take();
  PyObject* result = PyList_New(static_cast<Py_ssize_t>(events.size()));
  size_t i = 0;
  for (; result != nullptr && i < events.size(); ++i) {
    PyObject* item = wrap(events[i]);
    if (item == nullptr) {
      Py_CLEAR(result);
      ++i;
      break;
    }
    PyList_SetItem(result, static_cast<Py_ssize_t>(i), item);  // steals `item`; cannot fail here
  }
  for (; i < events.size(); ++i) drop(events[i]);
  return result;
}

// Module setup: the heap type of `spec`, added to `module` under `name`. `keep`, for a type the
// module instantiates itself, gets a reference of its own (the module's may be deleted from
// Python), held for the life of the process. False with a Python error set.
inline bool AddType(PyObject* module, PyType_Spec* spec, const char* name, PyTypeObject** keep = nullptr) {
  PyObject* type = PyType_FromSpec(spec);
  if (type == nullptr) return false;
  if (keep != nullptr) {
    Py_INCREF(type);
    *keep = reinterpret_cast<PyTypeObject*>(type);
  }
  if (PyModule_AddObject(module, name, type) < 0) {  // steals the reference on success only
    Py_DECREF(type);
    return false;
  }
  return true;
}

// The end of a tp_dealloc: free the object's memory, then drop its reference to its (heap) type.
inline void FreeInstance(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  freefunc free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  free(self);
  Py_DECREF(type);
}

}  // namespace frontend

#endif  // TOOLKIT_NATIVE_FRONTEND_H_
