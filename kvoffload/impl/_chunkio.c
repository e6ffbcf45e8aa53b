/*
 * kvoffload.impl._chunkio: the file tier's chunk I/O with the interpreter
 * lock released once per call (the compiled build only).
 *
 * FileSystemTier's pool threads spend a chunk's time in system calls: open,
 * readv, close for a load; open (or rename of a recycled file), write,
 * fsync, close, rename for a store. Made from Python, each call gives up and
 * takes back the interpreter lock that all pool threads and the scheduler's
 * thread share. These functions make the same calls, in the same order and
 * with the same outcomes as the Python functions in fs_tier.py
 * (_read_chunk, _write_chunk), with the lock released for all of them.
 * fs_tier.py falls back to its Python functions when this module is not
 * built (the pure build, a machine with no C compiler).
 *
 * Buffers are taken through the buffer protocol and held until the call
 * returns, so a caller's memory cannot go away while the lock is released.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef O_DIRECT
#define O_DIRECT 0
#endif
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

/* fsync policies, in step with fs_tier.FsyncPolicy */
#define FSYNC_NONE 0
#define FSYNC_CHUNK 1
#define FSYNC_FULL 2

static int open_retrying(const char *path, int flags, mode_t mode)
{
    int fd;
    do {
        fd = open(path, flags, mode);
    } while (fd < 0 && errno == EINTR);
    return fd;
}

/*
 * Read the file at `path` into `payload` and on into `spare` (a file longer
 * than the payload fills some of it); stop once the payload is whole or the
 * file ends. Returns the bytes read, or -errno.
 */
static Py_ssize_t read_one(const char *path, char *payload, Py_ssize_t want,
                           char *spare, Py_ssize_t spare_len, int direct)
{
    int fd = open_retrying(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0), 0);
    if (fd < 0)
        return -(Py_ssize_t)errno;
    Py_ssize_t got = 0;
    Py_ssize_t result;
    for (;;) {
        struct iovec iov[2];
        int count = 0;
        if (got < want) {
            iov[count].iov_base = payload + got;
            iov[count].iov_len = (size_t)(want - got);
            count++;
        }
        Py_ssize_t into_spare = got > want ? got - want : 0;
        if (into_spare < spare_len) {
            iov[count].iov_base = spare + into_spare;
            iov[count].iov_len = (size_t)(spare_len - into_spare);
            count++;
        }
        if (count == 0) { /* payload and spare full */
            result = got;
            break;
        }
        ssize_t n = readv(fd, iov, count);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            result = -(Py_ssize_t)errno;
            break;
        }
        got += n;
        if (n == 0 || got >= want) {
            result = got;
            break;
        }
    }
    close(fd);
    return result;
}

static void release_all(Py_buffer *views, PyObject **names, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
        Py_XDECREF(names[i]);
    }
}

PyDoc_STRVAR(read_chunks_doc,
"read_chunks(paths, payloads, spare, direct) -> list[int]\n\n"
"Read each file of `paths` into the writable buffer of `payloads` at the\n"
"same index, reading on into `spare` past the payload (a longer file fills\n"
"some of it). Each item is the bytes read (more than the payload's length\n"
"for a longer file) or -errno for a failed open or read. The interpreter\n"
"lock is released once for the whole batch.");

static PyObject *read_chunks(PyObject *self, PyObject *args)
{
    PyObject *paths, *payloads;
    Py_buffer spare;
    int direct;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOw*p:read_chunks", &paths, &payloads, &spare, &direct))
        return NULL;
    PyObject *result = NULL;
    PyObject *path_seq = PySequence_Fast(paths, "paths must be a sequence");
    PyObject *payload_seq = path_seq ? PySequence_Fast(payloads, "payloads must be a sequence") : NULL;
    Py_buffer *views = NULL;
    PyObject **names = NULL;
    Py_ssize_t *counts = NULL;
    Py_ssize_t n = 0, held = 0;
    if (payload_seq == NULL)
        goto done;
    n = PySequence_Fast_GET_SIZE(path_seq);
    if (PySequence_Fast_GET_SIZE(payload_seq) != n) {
        PyErr_SetString(PyExc_ValueError, "paths and payloads differ in length");
        goto done;
    }
    views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    names = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    counts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    if (views == NULL || names == NULL || counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(path_seq, held), &names[held]))
            goto done;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(payload_seq, held), &views[held],
                               PyBUF_WRITABLE) < 0)
            goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        counts[i] = read_one(PyBytes_AS_STRING(names[i]), views[i].buf, views[i].len,
                             spare.buf, spare.len, direct);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *count = PyLong_FromSsize_t(counts[i]);
        if (count == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, count);
    }
done:
    if (views != NULL && names != NULL)
        release_all(views, names, held < n ? held + 1 : n);
    PyMem_Free(views);
    PyMem_Free(names);
    PyMem_Free(counts);
    Py_XDECREF(path_seq);
    Py_XDECREF(payload_seq);
    PyBuffer_Release(&spare);
    return result;
}

/* A failed step of write_one: errno, and which path it names. */
enum which_path { ON_TEMP, ON_DIRECTORY, ON_RECYCLED };

struct failure {
    int error; /* errno; 0 for a write that made no progress */
    enum which_path path;
};

static int write_all(int fd, const char *data, Py_ssize_t len)
{
    Py_ssize_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, data + done, (size_t)(len - done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        if (n == 0)
            return -1; /* no progress: a short write */
        done += n;
    }
    return 0;
}

static int fsync_directory_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *directory;
    if (slash == NULL) {
        directory = strdup(".");
    } else if (slash == path) {
        directory = strdup("/");
    } else {
        directory = strndup(path, (size_t)(slash - path));
    }
    if (directory == NULL)
        return ENOMEM;
    int fd = open_retrying(directory, O_RDONLY | O_CLOEXEC, 0);
    free(directory);
    if (fd < 0)
        return errno;
    int error = fsync(fd) < 0 ? errno : 0;
    close(fd);
    return error;
}

/* The steps of fs_tier._write_chunk; returns 0, or fills `failure`. */
static int write_one(const char *temp, const char *final, const char *data, Py_ssize_t len,
                     int fsync_mode, int direct, const char *recycled, struct failure *failure)
{
    int direct_flag = direct ? O_DIRECT : 0;
    int fd = -1;
    if (recycled != NULL) {
        if (rename(recycled, temp) == 0) {
            fd = open_retrying(temp, O_WRONLY | O_CLOEXEC | direct_flag, 0);
            if (fd < 0 && errno != ENOENT) {
                failure->error = errno;
                failure->path = ON_TEMP;
                unlink(temp);
                return -1;
            }
        } else if (errno != ENOENT) {
            failure->error = errno;
            failure->path = ON_RECYCLED;
            unlink(temp);
            return -1;
        }
    }
    if (fd < 0) { /* no recycled file, or it vanished: a new file */
        fd = open_retrying(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | direct_flag, 0644);
        if (fd < 0) {
            failure->error = errno;
            failure->path = ON_TEMP;
            return -1;
        }
    }
    int error = 0;
    if (recycled != NULL) {
        struct stat status;
        if (fstat(fd, &status) < 0)
            error = errno;
        else if (status.st_size > len && ftruncate(fd, len) < 0)
            error = errno;
    }
    if (error == 0)
        error = write_all(fd, data, len);
    if (error == 0 && fsync_mode != FSYNC_NONE && fsync(fd) < 0)
        error = errno;
    if (close(fd) < 0 && error == 0 && errno != EINTR)
        error = errno;
    if (error == 0 && rename(temp, final) < 0)
        error = errno;
    if (error != 0) {
        failure->error = error < 0 ? 0 : error;
        failure->path = ON_TEMP;
        unlink(temp);
        return -1;
    }
    if (fsync_mode == FSYNC_FULL) {
        error = fsync_directory_of(final);
        if (error != 0) {
            failure->error = error;
            failure->path = ON_DIRECTORY;
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(write_chunk_doc,
"write_chunk(temp_path, final_path, payload, fsync, direct, recycled) -> None\n\n"
"fs_tier._write_chunk with the interpreter lock released: write `payload`\n"
"under `temp_path` (over the file `recycled` renamed to it, when given and\n"
"still there; else a new file), fsync it when `fsync` (0 none, 1 the chunk,\n"
"2 the chunk and its directory) says so, and rename it to `final_path`.\n"
"Raises OSError (FileNotFoundError when the folder is missing) and leaves\n"
"no temp file behind on failure.");

static PyObject *write_chunk(PyObject *self, PyObject *args)
{
    PyObject *temp = NULL, *final = NULL, *recycled_arg, *recycled = NULL;
    Py_buffer payload;
    int fsync_mode, direct;
    (void)self;
    if (!PyArg_ParseTuple(args, "O&O&y*ipO:write_chunk", PyUnicode_FSConverter, &temp,
                          PyUnicode_FSConverter, &final, &payload, &fsync_mode, &direct,
                          &recycled_arg))
        goto parse_failed;
    if (recycled_arg != Py_None && !PyUnicode_FSConverter(recycled_arg, &recycled)) {
        PyBuffer_Release(&payload);
        goto parse_failed;
    }
    struct failure failure = {0, ON_TEMP};
    int status;
    const char *temp_s = PyBytes_AS_STRING(temp), *final_s = PyBytes_AS_STRING(final);
    const char *recycled_s = recycled ? PyBytes_AS_STRING(recycled) : NULL;
    Py_BEGIN_ALLOW_THREADS
    status = write_one(temp_s, final_s, payload.buf, payload.len, fsync_mode, direct,
                       recycled_s, &failure);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&payload);
    PyObject *result = NULL;
    if (status == 0) {
        result = Py_NewRef(Py_None);
    } else if (failure.error == 0) {
        PyErr_Format(PyExc_OSError, "short write to %s", temp_s);
    } else {
        PyObject *named = failure.path == ON_RECYCLED   ? recycled
                          : failure.path == ON_DIRECTORY ? final
                                                         : temp;
        PyObject *name = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(named));
        errno = failure.error;
        if (name != NULL) {
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
            Py_DECREF(name);
        }
    }
    Py_DECREF(temp);
    Py_DECREF(final);
    Py_XDECREF(recycled);
    return result;
parse_failed:
    Py_XDECREF(temp);
    Py_XDECREF(final);
    return NULL;
}

static PyMethodDef methods[] = {
    {"read_chunks", read_chunks, METH_VARARGS, read_chunks_doc},
    {"write_chunk", write_chunk, METH_VARARGS, write_chunk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_chunkio",
    "The file tier's chunk I/O with the interpreter lock released once per call.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__chunkio(void)
{
    return PyModule_Create(&module);
}
