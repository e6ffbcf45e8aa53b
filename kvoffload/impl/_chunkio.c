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
 * (_read_chunk, _write_chunk), with the lock released once per batch of
 * them: a pool thread's share of a job's items, loads or stores. A store's
 * CRC-32 (which names its file) is computed in the same batch, by a C
 * function the caller names by address (libdeflate's, or zlib's).
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
#include <stdint.h>
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

/* A new list of the `n` values as Python ints, or NULL (an error set). */
static PyObject *int_list(const long long *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyLong_FromLongLong(values[i]);
        if (value == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
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
    long long *counts = NULL;
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
    counts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(long long));
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
    result = int_list(counts, n);
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

/*
 * zlib's CRC-32 (the reflected polynomial 0xEDB88320), built in: a table
 * for short buffers and ends, and on x86-64 CPUs with PCLMULQDQ, carry-less
 * multiplication folding 64 bytes per step (Gopal et al., "Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel,
 * 2009). The folds keep a 16-byte value whose CRC, followed by the bytes
 * not yet folded, is the CRC of all the bytes folded so far and those; the
 * table finishes it. For machines without libdeflate, whose zlib computes
 * it several times slower (fs_tier.py chooses).
 */
static uint32_t crc_table[256];

static void make_crc_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* the CRC register over `n` bytes, without zlib's inversions */
static uint32_t crc_bytes(uint32_t reg, const unsigned char *p, size_t n)
{
    while (n--)
        reg = crc_table[(reg ^ *p++) & 0xff] ^ (reg >> 8);
    return reg;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CLMUL_BUILT 1

__attribute__((target("pclmul,sse2"))) static inline __m128i fold(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("pclmul,sse2"))) static uint32_t crc_clmul(uint32_t reg,
                                                                 const unsigned char *p,
                                                                 size_t n)
{
    if (n < 64)
        return crc_bytes(reg, p, n);
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p),
                               _mm_cvtsi32_si128((int)reg));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
    /* x^(4*128+32) and x^(4*128-32) mod P (bit-reflected, shifted): 64 bytes on */
    const __m128i by64 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    while (n >= 64) {
        x0 = _mm_xor_si128(fold(x0, by64), _mm_loadu_si128((const __m128i *)p));
        x1 = _mm_xor_si128(fold(x1, by64), _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = _mm_xor_si128(fold(x2, by64), _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = _mm_xor_si128(fold(x3, by64), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    /* x^(128+32) and x^(128-32) mod P: 16 bytes on */
    const __m128i by16 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m128i x = _mm_xor_si128(fold(x0, by16), x1);
    x = _mm_xor_si128(fold(x, by16), x2);
    x = _mm_xor_si128(fold(x, by16), x3);
    while (n >= 16) {
        x = _mm_xor_si128(fold(x, by16), _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    unsigned char folded[16];
    _mm_storeu_si128((__m128i *)folded, x);
    return crc_bytes(crc_bytes(0, folded, 16), p, n);
}
#endif

static int clmul_runs = 0; /* set at import: the CPU has PCLMULQDQ */

/* zlib's crc32(crc, p, n) */
static uint32_t crc_builtin(uint32_t crc, const unsigned char *p, size_t n)
{
#ifdef CLMUL_BUILT
    if (clmul_runs)
        return ~crc_clmul(~crc, p, n);
#endif
    return ~crc_bytes(~crc, p, n);
}

/* The CRC-32 a write_chunks caller asks for (crc_kind): the built-in one,
 * or a C function named by address; all compute zlib's CRC-32. */
#define CRC_NONE 0
#define CRC_LIBDEFLATE 1 /* uint32_t libdeflate_crc32(uint32_t, const void *, size_t) */
#define CRC_ZLIB 2       /* uLong crc32_z(uLong, const Bytef *, z_size_t) */
#define CRC_BUILTIN 3    /* crc_builtin, above */
typedef uint32_t (*libdeflate_crc_fn)(uint32_t, const void *, size_t);
typedef unsigned long (*zlib_crc_fn)(unsigned long, const unsigned char *, size_t);

static uint32_t crc_of(void *function, int kind, const char *data, Py_ssize_t len)
{
    if (kind == CRC_BUILTIN)
        return crc_builtin(0, (const unsigned char *)data, (size_t)len);
    if (kind == CRC_LIBDEFLATE)
        return ((libdeflate_crc_fn)function)(0, data, (size_t)len);
    return (uint32_t)((zlib_crc_fn)function)(0, (const unsigned char *)data, (size_t)len);
}

static const char HEX[] = "0123456789abcdef";

/* Make the folder `path` is in (one level: its parent must exist), as
 * fs_tier._write_chunk does; 0 when it is there now, else -1 (errno set). */
static int make_folder_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL || slash == path) {
        errno = ENOENT;
        return -1;
    }
    char *folder = strndup(path, (size_t)(slash - path));
    if (folder == NULL) {
        errno = ENOMEM;
        return -1;
    }
    int made = mkdir(folder, 0777);
    int error = made < 0 && errno != EEXIST ? errno : 0;
    free(folder);
    if (error != 0) {
        errno = error;
        return -1;
    }
    return 0;
}

/* A store's CRC-32, computed once its temp file is open (a write that
 * cannot open its file computes none), written as 8 hex digits into the
 * final path at `digits` */
struct crc_request {
    void *function;
    int kind;
    char *digits;
    uint32_t value;
};

/* The steps of fs_tier._write_chunk, the CRC-32 (when `crc` is not NULL)
 * computed between the open and the write; returns 0, or fills `failure`. */
static int write_one(const char *temp, const char *final, const char *data, Py_ssize_t len,
                     int fsync_mode, int direct, const char *recycled, struct crc_request *crc,
                     struct failure *failure)
{
    int direct_flag = direct ? O_DIRECT : 0;
    int fd = -1;
    if (recycled != NULL) {
        int moved = rename(recycled, temp);
        if (moved < 0 && errno == ENOENT) { /* recycled gone, or no folder for temp yet */
            if (make_folder_of(temp) == 0)
                moved = rename(recycled, temp);
            else
                errno = ENOENT;
        }
        if (moved == 0) {
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
        int create = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | direct_flag;
        fd = open_retrying(temp, create, 0644);
        if (fd < 0 && errno == ENOENT) { /* the shard's first chunk: its folder */
            if (make_folder_of(temp) == 0)
                fd = open_retrying(temp, create, 0644);
            else
                errno = ENOENT; /* the open's error, as the Python writer raises */
        }
        if (fd < 0) {
            failure->error = errno;
            failure->path = ON_TEMP;
            return -1;
        }
    }
    if (crc != NULL) {
        crc->value = crc_of(crc->function, crc->kind, data, len);
        for (int d = 0; d < 8; d++)
            crc->digits[d] = HEX[(crc->value >> (28 - 4 * d)) & 0xf];
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

PyDoc_STRVAR(write_chunks_doc,
"write_chunks(temps, prefixes, suffix, payloads, recycled, fsync, direct,\n"
"             crc_function, crc_kind) -> list[int]\n\n"
"fs_tier._write_chunk for each item, the interpreter lock released once for\n"
"the whole batch: write the buffer of `payloads` under the path of `temps`\n"
"(over the file of `recycled` renamed to it, when that is not None and\n"
"still there; else a new file), fsync it when `fsync` (0 none, 1 the chunk,\n"
"2 the chunk and its directory) says so, and rename it to its final path:\n"
"its prefix, then (unless `crc_kind` is 0) the payload's CRC-32 as 8 hex\n"
"digits, then `suffix`. `crc_kind` says what computes zlib's CRC-32: 1\n"
"libdeflate's libdeflate_crc32 and 2 zlib's crc32_z, at the address\n"
"`crc_function`; 3 this module's own (crc32 below). Each item of the result\n"
"is the CRC-32 (0 without one) or -errno for a failed write (-EIO for one\n"
"that made no progress), which leaves no temp file behind. A temp file's\n"
"missing folder is made (one level: a shard's first chunk).");

static PyObject *write_chunks(PyObject *self, PyObject *args)
{
    PyObject *temps, *prefixes, *suffix_arg, *payloads, *recycled_arg;
    PyObject *suffix = NULL;
    int fsync_mode, direct, crc_kind;
    unsigned long long crc_address;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOipKi:write_chunks", &temps, &prefixes, &suffix_arg,
                          &payloads, &recycled_arg, &fsync_mode, &direct, &crc_address,
                          &crc_kind))
        return NULL;
    void *crc_function = (void *)(uintptr_t)crc_address;
    if (crc_kind < CRC_NONE || crc_kind > CRC_BUILTIN) {
        PyErr_Format(PyExc_ValueError, "unknown crc_kind %d", crc_kind);
        return NULL;
    }
    if ((crc_kind == CRC_LIBDEFLATE || crc_kind == CRC_ZLIB) && crc_function == NULL) {
        PyErr_SetString(PyExc_ValueError, "crc_kind 1 and 2 need a crc_function");
        return NULL;
    }
    int computes_crc = crc_kind != CRC_NONE;
    if (!PyUnicode_FSConverter(suffix_arg, &suffix))
        return NULL;
    PyObject *result = NULL;
    PyObject *seqs[4] = {NULL, NULL, NULL, NULL};
    PyObject *sources[4] = {temps, prefixes, payloads, recycled_arg};
    Py_buffer *views = NULL;
    PyObject **temp_names = NULL, **recycled_names = NULL, **prefix_names = NULL;
    char **finals = NULL;
    long long *outcomes = NULL; /* a CRC-32 (0 .. 2**32 - 1) or -errno */
    Py_ssize_t n = 0, held = 0;
    for (int k = 0; k < 4; k++) {
        seqs[k] = PySequence_Fast(sources[k], "write_chunks takes sequences");
        if (seqs[k] == NULL)
            goto done;
    }
    n = PySequence_Fast_GET_SIZE(seqs[0]);
    for (int k = 1; k < 4; k++) {
        if (PySequence_Fast_GET_SIZE(seqs[k]) != n) {
            PyErr_SetString(PyExc_ValueError,
                            "temps, prefixes, payloads and recycled differ in length");
            goto done;
        }
    }
    size_t slots = (size_t)(n ? n : 1);
    views = PyMem_Calloc(slots, sizeof(Py_buffer));
    temp_names = PyMem_Calloc(slots, sizeof(PyObject *));
    recycled_names = PyMem_Calloc(slots, sizeof(PyObject *));
    prefix_names = PyMem_Calloc(slots, sizeof(PyObject *));
    finals = PyMem_Calloc(slots, sizeof(char *));
    outcomes = PyMem_Calloc(slots, sizeof(long long));
    if (views == NULL || temp_names == NULL || recycled_names == NULL || prefix_names == NULL
        || finals == NULL || outcomes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t suffix_len = PyBytes_GET_SIZE(suffix);
    Py_ssize_t digits = computes_crc ? 8 : 0;
    for (; held < n; held++) {
        PyObject *recycled_item = PySequence_Fast_GET_ITEM(seqs[3], held);
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seqs[0], held), &temp_names[held])
            || !PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seqs[1], held),
                                      &prefix_names[held])
            || (recycled_item != Py_None
                && !PyUnicode_FSConverter(recycled_item, &recycled_names[held])))
            goto done;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seqs[2], held), &views[held],
                               PyBUF_SIMPLE) < 0)
            goto done;
        Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix_names[held]);
        finals[held] = PyMem_Malloc((size_t)(prefix_len + digits + suffix_len + 1));
        if (finals[held] == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(finals[held], PyBytes_AS_STRING(prefix_names[held]), (size_t)prefix_len);
        memcpy(finals[held] + prefix_len + digits, PyBytes_AS_STRING(suffix),
               (size_t)suffix_len + 1);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        struct crc_request crc = {crc_function, crc_kind,
                                  finals[i] + PyBytes_GET_SIZE(prefix_names[i]), 0};
        struct failure failure = {0, ON_TEMP};
        const char *recycled = recycled_names[i] ? PyBytes_AS_STRING(recycled_names[i]) : NULL;
        if (write_one(PyBytes_AS_STRING(temp_names[i]), finals[i], views[i].buf, views[i].len,
                      fsync_mode, direct, recycled, computes_crc ? &crc : NULL,
                      &failure)
            == 0)
            outcomes[i] = crc.value;
        else
            outcomes[i] = -(long long)(failure.error ? failure.error : EIO);
    }
    Py_END_ALLOW_THREADS
    result = int_list(outcomes, n);
done:
    if (views != NULL && temp_names != NULL && recycled_names != NULL && prefix_names != NULL
        && finals != NULL) {
        for (Py_ssize_t i = 0; i < (held < n ? held + 1 : n); i++) {
            if (views[i].obj != NULL)
                PyBuffer_Release(&views[i]);
            Py_XDECREF(temp_names[i]);
            Py_XDECREF(recycled_names[i]);
            Py_XDECREF(prefix_names[i]);
            PyMem_Free(finals[i]);
        }
    }
    PyMem_Free(views);
    PyMem_Free(temp_names);
    PyMem_Free(recycled_names);
    PyMem_Free(prefix_names);
    PyMem_Free(finals);
    PyMem_Free(outcomes);
    for (int k = 0; k < 4; k++)
        Py_XDECREF(seqs[k]);
    Py_DECREF(suffix);
    return result;
}

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0) -> int\n\n"
"zlib.crc32(data, value), computed by this module (carry-less\n"
"multiplication where clmul_crc32() says so, else a table), the\n"
"interpreter lock released for buffers of 64 KiB and more.");

static PyObject *crc32(PyObject *self, PyObject *args)
{
    Py_buffer data;
    unsigned int value = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value))
        return NULL;
    uint32_t crc;
    if (data.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc_builtin(value, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_builtin(value, data.buf, (size_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(clmul_crc32_doc,
"clmul_crc32() -> bool\n\n"
"Whether crc32 (and write_chunks' crc_kind 3) runs by carry-less\n"
"multiplication here: an x86-64 build on a CPU with PCLMULQDQ.");

static PyObject *clmul_crc32(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyBool_FromLong(clmul_runs);
}

static PyMethodDef methods[] = {
    {"crc32", crc32, METH_VARARGS, crc32_doc},
    {"clmul_crc32", clmul_crc32, METH_NOARGS, clmul_crc32_doc},
    {"read_chunks", read_chunks, METH_VARARGS, read_chunks_doc},
    {"write_chunks", write_chunks, METH_VARARGS, write_chunks_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_chunkio",
    "The file tier's chunk I/O with the interpreter lock released once per call.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__chunkio(void)
{
    make_crc_table();
#ifdef CLMUL_BUILT
    __builtin_cpu_init();
    clmul_runs = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2");
#endif
    return PyModule_Create(&module);
}
