/* Batches of Dafka messages sent and received in C: the optional fast path of
 * `backends/dafka/held_send.py` (records_sender) and `held_recv.py` (batch_receiver).
 *
 * From Python, every frame costs a call into pyzmq (or into libzmq through ctypes):
 * 0.4-0.5 us each, two frames a record, on the producer actor's thread and again on the
 * store writer's. Here one call sends or receives a whole batch. libzmq is the one pyzmq
 * loaded (its path comes from Python, `load`), reached through dlsym: nothing is linked
 * against it. Sockets are libzmq's raw handles (`Socket.underlying`), used only by the
 * thread that owns them and only while they are open, as the ctypes paths require.
 *
 * Both functions behave as the Python loops they replace (tests/dafka/test_held.py runs
 * the same tests on both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2
#define SEQUENCE_BYTES 8

/* zmq_msg_t: 64 bytes, aligned as a pointer (zmq.h). */
typedef struct {
    union {
        unsigned char bytes[64];
        void *align;
    } u;
} zmq_msg;

static int (*zmq_send_)(void *, const void *, size_t, int);
static int (*zmq_msg_init_)(zmq_msg *);
static int (*zmq_msg_recv_)(zmq_msg *, void *, int);
static void *(*zmq_msg_data_)(zmq_msg *);
static size_t (*zmq_msg_size_)(zmq_msg *);
static int (*zmq_msg_more_)(zmq_msg *);
static int (*zmq_msg_close_)(zmq_msg *);
static int (*zmq_errno_)(void);

static PyObject *zmq_error(int code) {
    errno = code;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* load(path): bind to the libzmq already loaded from `path`; OSError if it is not. */
static PyObject *load(PyObject *self, PyObject *arg) {
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) {
        PyErr_Format(PyExc_OSError, "libzmq is not loaded from %s", path);
        return NULL;
    }
    *(void **)&zmq_send_ = dlsym(library, "zmq_send");
    *(void **)&zmq_msg_init_ = dlsym(library, "zmq_msg_init");
    *(void **)&zmq_msg_recv_ = dlsym(library, "zmq_msg_recv");
    *(void **)&zmq_msg_data_ = dlsym(library, "zmq_msg_data");
    *(void **)&zmq_msg_size_ = dlsym(library, "zmq_msg_size");
    *(void **)&zmq_msg_more_ = dlsym(library, "zmq_msg_more");
    *(void **)&zmq_msg_close_ = dlsym(library, "zmq_msg_close");
    *(void **)&zmq_errno_ = dlsym(library, "zmq_errno");
    if (!zmq_send_ || !zmq_msg_init_ || !zmq_msg_recv_ || !zmq_msg_data_ || !zmq_msg_size_
        || !zmq_msg_more_ || !zmq_msg_close_ || !zmq_errno_) {
        zmq_send_ = NULL;
        PyErr_Format(PyExc_OSError, "%s lacks a libzmq function", path);
        return NULL;
    }
    Py_RETURN_NONE;
}

static int loaded(void) {
    if (zmq_send_ == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "load() libzmq first");
        return 0;
    }
    return 1;
}

/* send_records(handle, prefix, sequence, contents, release_gil): for each of `contents`
 * (a list of bytes) a two-frame message: `prefix` followed by the sequence (8 bytes, big
 * endian), counting up from `sequence`, then the content. TypeError, before anything is
 * sent, when a content is not bytes; OSError with libzmq's errno at the first send that
 * fails (the records before it are sent). With `release_gil`, the GIL is given up once
 * for the whole batch instead of not at all. */
static PyObject *send_records(PyObject *self, PyObject *args) {
    unsigned long long handle_value;
    Py_buffer prefix;
    PyObject *first, *contents;
    int release_gil;
    if (!loaded())
        return NULL;
    if (!PyArg_ParseTuple(args, "Ky*OO!p", &handle_value, &prefix, &first, &PyList_Type,
                          &contents, &release_gil))
        return NULL;
    /* OverflowError for a sequence that does not fit 8 bytes, as struct.pack's error. */
    unsigned long long sequence = PyLong_AsUnsignedLongLong(first);
    if (sequence == (unsigned long long)-1 && PyErr_Occurred()) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    if (PyList_GET_SIZE(contents) > 0
        && (unsigned long long)(PyList_GET_SIZE(contents) - 1) > ULLONG_MAX - sequence) {
        PyBuffer_Release(&prefix);
        PyErr_SetString(PyExc_OverflowError, "the batch's last sequence does not fit 8 bytes");
        return NULL;
    }
    void *handle = (void *)(uintptr_t)handle_value;
    /* A reference to every content while the GIL may be given up: whatever happens to
     * the list meanwhile, the bytes stay. */
    PyObject *items = PyList_AsTuple(contents);
    Py_ssize_t count = items == NULL ? 0 : PyTuple_GET_SIZE(items);
    size_t header_size = (size_t)prefix.len + SEQUENCE_BYTES;
    unsigned char *header = PyMem_Malloc(header_size);
    const char **data = PyMem_Malloc(sizeof(char *) * (size_t)(count + 1));
    size_t *sizes = PyMem_Malloc(sizeof(size_t) * (size_t)(count + 1));
    PyObject *result = NULL;
    if (items == NULL)
        goto done;
    if (header == NULL || data == NULL || sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *content = PyTuple_GET_ITEM(items, i);
        if (!PyBytes_CheckExact(content)) {
            PyErr_Format(PyExc_TypeError, "record contents must be bytes, not %.100s",
                         Py_TYPE(content)->tp_name);
            goto done;
        }
        data[i] = PyBytes_AS_STRING(content);
        sizes[i] = (size_t)PyBytes_GET_SIZE(content);
    }
    memcpy(header, prefix.buf, (size_t)prefix.len);
    unsigned char *number = header + prefix.len;
    int failed = 0;
    PyThreadState *state = release_gil ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < count; i++, sequence++) {
        unsigned long long value = sequence;
        for (int at = SEQUENCE_BYTES - 1; at >= 0; at--, value >>= 8)
            number[at] = (unsigned char)(value & 0xff);
        if (zmq_send_(handle, header, header_size, ZMQ_SNDMORE) < 0
            || zmq_send_(handle, data[i], sizes[i], 0) < 0) {
            failed = zmq_errno_();
            break;
        }
    }
    if (state != NULL)
        PyEval_RestoreThread(state);
    if (failed)
        zmq_error(failed);
    else
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(items);
    PyMem_Free(header);
    PyMem_Free(data);
    PyMem_Free(sizes);
    PyBuffer_Release(&prefix);
    return result;
}

/* One received frame as bytes. */
static PyObject *frame_bytes(zmq_msg *msg) {
    return PyBytes_FromStringAndSize(zmq_msg_data_(msg), (Py_ssize_t)zmq_msg_size_(msg));
}

/* receive(handle, limit): the messages waiting, up to `limit`, without blocking: a list
 * of [first frame] or [first frame, second frame] lists; the frames of a message beyond
 * its second are read as messages of their own (as the store and a C peer read them).
 * OSError with libzmq's errno for a failure other than nothing waiting (EAGAIN) or an
 * interruption (EINTR), raised only when no message came before it (those are returned,
 * and the next call raises). */
static PyObject *receive(PyObject *self, PyObject *args) {
    unsigned long long handle_value;
    Py_ssize_t limit;
    if (!loaded())
        return NULL;
    if (!PyArg_ParseTuple(args, "Kn", &handle_value, &limit))
        return NULL;
    void *handle = (void *)(uintptr_t)handle_value;
    PyObject *messages = PyList_New(0);
    if (messages == NULL)
        return NULL;
    zmq_msg msg;
    zmq_msg_init_(&msg);
    while (PyList_GET_SIZE(messages) < limit) {
        if (zmq_msg_recv_(&msg, handle, ZMQ_DONTWAIT) < 0) {
            int code = zmq_errno_();
            if (code != EAGAIN && code != EINTR && PyList_GET_SIZE(messages) == 0) {
                zmq_error(code);
                Py_CLEAR(messages);
            }
            break;
        }
        PyObject *message = PyList_New(0);
        PyObject *first = message == NULL ? NULL : frame_bytes(&msg);
        int ok = first != NULL && PyList_Append(message, first) == 0;
        Py_XDECREF(first);
        /* The other parts are here already: a message arrives whole. */
        if (ok && zmq_msg_more_(&msg) && zmq_msg_recv_(&msg, handle, ZMQ_DONTWAIT) >= 0) {
            PyObject *second = frame_bytes(&msg);
            ok = second != NULL && PyList_Append(message, second) == 0;
            Py_XDECREF(second);
        }
        ok = ok && PyList_Append(messages, message) == 0;
        Py_XDECREF(message);
        if (!ok) {
            Py_CLEAR(messages);
            break;
        }
    }
    zmq_msg_close_(&msg);
    return messages;
}

static PyMethodDef methods[] = {
    {"load", load, METH_O, "Bind to the libzmq loaded from the given path."},
    {"send_records", send_records, METH_VARARGS, "Send a batch of two-frame records."},
    {"receive", receive, METH_VARARGS, "Receive the messages waiting, up to a limit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_zmqbatch", "Batches of Dafka messages sent and received in C.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__zmqbatch(void) { return PyModule_Create(&module); }
