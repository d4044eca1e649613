/* Runs of 3-argument commands that repeat one first argument, parsed in C: the optional
 * fast path of `gateway/resp/fastpath.py` (`_Repeat.take`).
 *
 * A pipeline of RPUSHX (or RPUSH acks, or BLPOP) is one such run. In Python, each command
 * of it cost 0.3-0.5 us of the event loop's thread (its header compared and sliced, its
 * lengths read from text, its list built), more when the key changes at every command (a
 * pipeline round-robin over topics); here 0.15-0.16 us whatever the keys
 * (`bench/parse_cost.py`).
 *
 * `take` accepts exactly what `_Repeat.take` accepts, and stops where it stops
 * (tests/gateway/resp runs every parser test on both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* A bulk length has at most this many digits: the CRLF after it lies within
 * `MAX_DIGITS + 1` bytes of its start (gateway.resp.requests.MAX_DIGITS is 20). */
#define LENGTH_DIGITS 19

/* The canonical bulk length (plain digits, no sign, no leading zero) and its CRLF at
 * buf[at:end], at most `max`: its value, and where its data starts in `*data`; -1 when it
 * is not one. */
static Py_ssize_t length_field(const char *buf, Py_ssize_t at, Py_ssize_t end,
                               Py_ssize_t max, Py_ssize_t *data) {
    Py_ssize_t i = at;
    unsigned long long value = 0;
    while (i < end && i - at < LENGTH_DIGITS && buf[i] >= '0' && buf[i] <= '9') {
        value = value * 10 + (unsigned long long)(buf[i] - '0');
        i++;
    }
    Py_ssize_t digits = i - at;
    if (digits == 0 || (digits > 1 && buf[at] == '0') || value > (unsigned long long)max)
        return -1;
    if (i + 2 > end || buf[i] != '\r' || buf[i + 1] != '\n')
        return -1;
    *data = i + 2;
    return (Py_ssize_t)value;
}

/* A limit as a Py_ssize_t: one past the largest (a limit may be configured up to any
 * size) is as good as the largest, no command being longer than a buffer; -1 on error
 * (negative limits are refused: the configuration's are at least 1). */
static Py_ssize_t limit(PyObject *value) {
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow > 0 || number > PY_SSIZE_T_MAX)
        return PY_SSIZE_T_MAX;
    if (number == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || number < 0) {
        PyErr_SetString(PyExc_ValueError, "take(): a negative limit");
        return -1;
    }
    return (Py_ssize_t)number;
}

/* take(buf, pos, end, first, named, max_bulk, max_query) -> (after, commands)
 *
 * The commands `[first, key, value]` at buf[pos:end], each `named` (its header up to its
 * key's length: `*3\r\n$<len(first)>\r\n<first>\r\n$`) and canonical, each argument at
 * most max_bulk bytes and the whole at most max_query; `after` is the index after the
 * last one taken (`pos` when none). A key equal to the one before is the same object. */
static PyObject *take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "take() takes 7 arguments");
        return NULL;
    }
    PyObject *data = args[0], *first = args[3], *named_object = args[4];
    if (!PyBytes_Check(data) || !PyBytes_Check(first) || !PyBytes_Check(named_object)) {
        PyErr_SetString(PyExc_TypeError, "take(): buf, first and named must be bytes");
        return NULL;
    }
    Py_ssize_t pos, end, max_bulk, max_query;
    if ((pos = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    if ((end = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred())
        return NULL;
    if ((max_bulk = limit(args[5])) < 0 || (max_query = limit(args[6])) < 0)
        return NULL;
    const char *buf = PyBytes_AS_STRING(data);
    if (end > PyBytes_GET_SIZE(data))
        end = PyBytes_GET_SIZE(data);
    const char *named = PyBytes_AS_STRING(named_object);
    Py_ssize_t named_length = PyBytes_GET_SIZE(named_object);

    PyObject *commands = PyList_New(0);
    if (commands == NULL)
        return NULL;
    PyObject *key = NULL; /* the last key taken */
    while (pos >= 0 && pos + named_length <= end && memcmp(buf + pos, named, named_length) == 0) {
        Py_ssize_t key_start, start;
        Py_ssize_t key_length = length_field(buf, pos + named_length, end, max_bulk, &key_start);
        if (key_length < 0)
            break;
        /* Lengths are compared with what is left before they are added: a length of up
         * to 19 digits added to a position would overflow. A command that does not end
         * before `end` is not taken (Python stops there as well). */
        if (key_length > end - key_start - 3)
            break;
        Py_ssize_t key_end = key_start + key_length;
        if (memcmp(buf + key_end, "\r\n$", 3) != 0)
            break;
        Py_ssize_t length = length_field(buf, key_end + 3, end, max_bulk, &start);
        if (length < 0 || length > end - start - 2 || length > max_query - (start + 2 - pos))
            break;
        Py_ssize_t stop = start + length;
        if (buf[stop] != '\r' || buf[stop + 1] != '\n')
            break;
        if (key == NULL || PyBytes_GET_SIZE(key) != key_length ||
            memcmp(PyBytes_AS_STRING(key), buf + key_start, key_length) != 0) {
            Py_XDECREF(key);
            key = PyBytes_FromStringAndSize(buf + key_start, key_length);
            if (key == NULL)
                goto failed;
        }
        PyObject *value = PyBytes_FromStringAndSize(buf + start, length);
        if (value == NULL)
            goto failed;
        PyObject *command = PyList_New(3);
        if (command == NULL) {
            Py_DECREF(value);
            goto failed;
        }
        Py_INCREF(first);
        Py_INCREF(key);
        PyList_SET_ITEM(command, 0, first);
        PyList_SET_ITEM(command, 1, key);
        PyList_SET_ITEM(command, 2, value);
        int appended = PyList_Append(commands, command);
        Py_DECREF(command);
        if (appended < 0)
            goto failed;
        pos = stop + 2;
    }
    Py_XDECREF(key);
    PyObject *result = Py_BuildValue("(nN)", pos, commands);
    return result;

failed:
    Py_XDECREF(key);
    Py_DECREF(commands);
    return NULL;
}

static PyMethodDef methods[] = {
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL,
     "take(buf, pos, end, first, named, max_bulk, max_query) -> (after, commands)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_repeat", "Runs of one 3-argument command, parsed in C.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__repeat(void) { return PyModule_Create(&module); }
