/* The per-entry CRC32C work in C (issue 21): checking an entry read from a bookie and cutting out
 * its payload, packaging an entry to send (wire/digest.py), a bookie's entry-log records framed
 * for a checkpoint and checked when read ahead (storage/entry_log.py); splitting a received chunk
 * into its frames (wire/framing.py); a ledger writer's acks and completions of pending adds
 * (core/writer.py) and its sends grouped by bookie (client/ledger.py); a bookie's runs of plain
 * adds and reads taken off its backlog, their answers framed, and a journal group built
 * (server/connection.py, wire/v2.py, storage/journal.py); and a journal's syncer thread, which
 * syncs what the bookie's loop wrote without ever taking the GIL (storage/journal.py). Those
 * modules' pure-Python paths do the same and are used where this module does not build or load (no
 * C compiler, a CPU without SSE 4.2, BOOKKEEPER_PY_PURE=1; see speedups.py); both are tested.
 *
 * An entry: ledgerId(8) entryId(8) lastAddConfirmed(8) length(8) crc(4) payload, big-endian; the
 * CRC32C (Castagnoli) covers the 32-byte header and then the payload.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__) || !(defined(__GNUC__) || defined(__clang__))
#error "the CRC32C speedups need x86-64 and GCC or Clang (the pure-Python path is used instead)"
#endif

#include <nmmintrin.h>

#define HEADER 32
#define CRC_END 36

/* CRC32C over three lanes at once: the crc32 instruction takes three cycles before its result
 * can be used but can start one every cycle, so one chain of them runs at a third of what the
 * unit can do. Each stretch of 3 * LANE bytes runs as three chains (the first from the CRC so
 * far, the other two from 0), joined by shifting a chain's register over the LANE zero bytes of
 * the lanes after it (a linear map of its 32 bits: four table lookups) and XORing: 1 KiB in ~66
 * ns against ~130 in one chain. */
#define LONG_LANE 256
#define SHORT_LANE 64
static uint32_t shift_long[4][256], shift_short[4][256]; /* made by make_shifts at import */

__attribute__((target("sse4.2"))) static uint32_t crc32c_zeros(uint32_t reg, Py_ssize_t n) {
    uint64_t c = reg;
    for (; n >= 8; n -= 8) c = _mm_crc32_u64(c, 0);
    return (uint32_t)c;
}

static void make_shifts(void) {
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            shift_long[k][b] = crc32c_zeros(b << (8 * k), LONG_LANE);
            shift_short[k][b] = crc32c_zeros(b << (8 * k), SHORT_LANE);
        }
}

static inline uint32_t crc32c_shift(uint32_t table[4][256], uint32_t reg) {
    return table[0][reg & 255] ^ table[1][(reg >> 8) & 255] ^ table[2][(reg >> 16) & 255] ^
           table[3][reg >> 24];
}

/* The three-chain stretches of ``lane`` bytes each from ``*p`` while ``*n`` allows. */
__attribute__((target("sse4.2"))) static inline uint64_t crc32c_lanes(
    uint64_t c, const uint8_t **p, Py_ssize_t *n, Py_ssize_t lane, uint32_t table[4][256]) {
    while (*n >= 3 * lane) {
        const uint8_t *q = *p;
        uint64_t c1 = 0, c2 = 0;
        for (Py_ssize_t i = 0; i < lane; i += 8) {
            uint64_t a, b, d;
            memcpy(&a, q + i, 8);
            memcpy(&b, q + lane + i, 8);
            memcpy(&d, q + 2 * lane + i, 8);
            c = _mm_crc32_u64(c, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
        }
        c = crc32c_shift(table, crc32c_shift(table, (uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
        *p += 3 * lane;
        *n -= 3 * lane;
    }
    return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_update(uint32_t crc, const uint8_t *p,
                                                                 Py_ssize_t n) {
    uint64_t c = crc ^ 0xFFFFFFFFu;
    c = crc32c_lanes(c, &p, &n, LONG_LANE, shift_long);
    c = crc32c_lanes(c, &p, &n, SHORT_LANE, shift_short);
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n > 0) {
        c32 = _mm_crc32_u8(c32, *p++);
        n--;
    }
    return c32 ^ 0xFFFFFFFFu;
}

static inline uint64_t load_be64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

static inline uint32_t load_be32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static inline void store_be64(uint8_t *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

static inline void store_be32(uint8_t *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

/* The integers args[first..first+count-1] into out; 0, or -1 with the error set. The call
 * must have had ``expected`` arguments (``usage`` says which). */
static int int_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected,
                    const char *usage, int first, int count, long long *out) {
    if (nargs != expected) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        out[i] = PyLong_AsLongLong(args[first + i]);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* A buffer in args[0] and ``count`` integers after it (see int_args); 0, or -1 with the error
 * set. The caller releases the buffer. */
static int buffer_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, int count,
                       long long *ids, Py_buffer *view) {
    if (int_args(args, nargs, count + 1, usage, 1, count, ids) < 0) return -1;
    return PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE);
}

/* Whether the ``n`` bytes at ``p`` are a CRC32C entry of the ledger and entry asked for whose
 * digest checks out (its payload then starts at p + CRC_END). */
static int entry_checks_out(const uint8_t *p, Py_ssize_t n, long long ledger_id,
                            long long entry_id) {
    if (n < CRC_END || (long long)load_be64(p) != ledger_id ||
        (long long)load_be64(p + 8) != entry_id)
        return 0;
    uint32_t crc = crc32c_update(0, p, HEADER);
    crc = crc32c_update(crc, p + CRC_END, n - CRC_END);
    return crc == load_be32(p + HEADER);
}

/* crc32c_payload(data, ledger_id, entry_id) -> bytes | None: the payload of a CRC32C entry
 * whose digest and ids check out; None otherwise (the caller says why). */
static PyObject *crc32c_payload(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long ids[2];
    Py_buffer view;
    if (buffer_args(args, nargs, "crc32c_payload(data, ledger_id, entry_id)", 2, ids, &view) < 0)
        return NULL;
    long long ledger_id = ids[0], entry_id = ids[1];
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *result = NULL;
    if (entry_checks_out(p, n, ledger_id, entry_id))
        result = PyBytes_FromStringAndSize((const char *)p + CRC_END, n - CRC_END);
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

/* A tuple type with no fields of its own (a named tuple: client/ledger.py LedgerEntry), whose
 * instances the C passes fill in place of calling it; 0 with a TypeError otherwise. */
static int plain_tuple_type(PyObject *type) {
    if (PyType_Check(type) && PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type) &&
        ((PyTypeObject *)type)->tp_basicsize == PyTuple_Type.tp_basicsize)
        return 1;
    PyErr_SetString(PyExc_TypeError, "entry_type: a tuple type without fields of its own");
    return 0;
}

/* entry_type((ledger, entry_id, payload)), made without calling the type, and out of the
 * cyclic garbage collector's sight: two ints and a bytes object cannot be part of a cycle, and
 * the collector, which stops watching plain tuples like these once it has seen their items,
 * never does so for a tuple type's instances. Watched, a catch-up reader's entries were walked
 * by every collection they lived through. */
static PyObject *new_entry(PyTypeObject *entry_type, PyObject *ledger, PyObject *entry_id,
                           PyObject *payload) {
    PyObject *entry = entry_type->tp_alloc(entry_type, 3);
    if (entry == NULL) return NULL;
    Py_INCREF(ledger);
    Py_INCREF(entry_id);
    Py_INCREF(payload);
    PyTuple_SET_ITEM(entry, 0, ledger);
    PyTuple_SET_ITEM(entry, 1, entry_id);
    PyTuple_SET_ITEM(entry, 2, payload);
    if (PyLong_CheckExact(ledger) && PyLong_CheckExact(entry_id) && PyBytes_CheckExact(payload))
        PyObject_GC_UnTrack(entry);
    return entry;
}

/* ``request`` into ``row`` (a client connection's pending v2 requests of one operation and
 * ledger, keyed by entry id) under ``entry`` unless a request is pending there already; then
 * ``entry`` goes to ``taken`` instead, for the caller to queue behind it. One dict operation. */
static int register_request(PyObject *row, PyObject *entry, PyObject *request, PyObject *taken) {
    Py_ssize_t before = PyDict_GET_SIZE(row);
    if (PyDict_SetDefault(row, entry, request) == NULL) return -1;
    if (PyDict_GET_SIZE(row) == before && PyList_Append(taken, entry) < 0) return -1;
    return 0;
}

/* v2_register(row, entry_ids, request) -> taken
 * A client connection's batch of v2 requests of one operation and ledger (client/connection.py
 * _register_batch: a writer's adds): ``request`` goes into ``row`` under each entry id not
 * pending there yet; the ids pending already are returned, in order. */
static PyObject *v2_register(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "v2_register(row: dict, entry_ids: list, request)");
        return NULL;
    }
    PyObject *row = args[0], *ids = args[1], *request = args[2];
    PyObject *taken = PyList_New(0);
    if (taken == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ids); i++) {
        if (register_request(row, PyList_GET_ITEM(ids, i), request, taken) < 0) {
            Py_DECREF(taken);
            return NULL;
        }
    }
    return taken;
}

/* v2_register_reads(row, ledger_id, entry_ids, request, header) -> (frames, taken)
 * A client connection's batch of plain v2 reads of one ledger (client/connection.py
 * read_batch): ``request`` goes into ``row`` (the connection's pending reads of that ledger,
 * keyed by entry id) under each entry id not taken yet, and ``frames`` holds a framed
 * READ_ENTRY request (header, ledger, entry) for every entry id; the ids taken already are
 * returned in ``taken``, in order, for the caller to queue behind the pending ones. */
static PyObject *v2_register_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "v2_register_reads(row: dict, ledger_id, entry_ids: list, request, "
                        "header)");
        return NULL;
    }
    PyObject *row = args[0], *ids = args[2], *request = args[3];
    long long ledger_id = PyLong_AsLongLong(args[1]);
    if (ledger_id == -1 && PyErr_Occurred()) return NULL;
    long header = PyLong_AsLong(args[4]);
    if (header == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(ids);
    PyObject *frames = PyBytes_FromStringAndSize(NULL, count * 24);
    PyObject *taken = PyList_New(0);
    if (frames == NULL || taken == NULL) goto failed;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(frames);
    const uint32_t size = __builtin_bswap32(20), head = __builtin_bswap32((uint32_t)header);
    const uint64_t ledger_be = __builtin_bswap64((uint64_t)ledger_id);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(ids, i);
        long long entry_id = PyLong_AsLongLong(entry);
        if (entry_id == -1 && PyErr_Occurred()) goto failed;
        if (register_request(row, entry, request, taken) < 0) goto failed;
        uint64_t e = __builtin_bswap64((uint64_t)entry_id);
        memcpy(out, &size, 4);
        memcpy(out + 4, &head, 4);
        memcpy(out + 8, &ledger_be, 8);
        memcpy(out + 16, &e, 8);
        out += 24;
    }
    return Py_BuildValue("NN", frames, taken);
failed:
    Py_XDECREF(frames);
    Py_XDECREF(taken);
    return NULL;
}

/* stripe_answers(frames, pending, results, first, ledger_id, entry_type, gone)
 *     -> (delivered, rest)
 * A client's pass over one bookie's answers to a striped range read (client/ledger.py
 * _RangeRead._answers), for CRC32C ledgers: each READ_ENTRY answer frame of ``frames`` (its
 * 24-byte fixed part, then the body) takes its attempt out of ``pending`` (``gone`` if none); a
 * stripe's read (attempt None) answered EOK whose body checks out becomes
 * entry_type((ledger_id, entry_id, payload)) at results[entry_id - first] (the payload copied
 * once, straight from the frame) and its id goes to ``delivered``; every other answer goes to
 * ``rest`` as (entry_id, rc, body, attempt), for the caller's long way (failures, digest
 * errors, speculative attempts). */
static PyObject *stripe_answers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) ||
        !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "stripe_answers(frames: list, pending: dict, results: list, first: int, "
                        "ledger_id: int, entry_type, gone)");
        return NULL;
    }
    if (!plain_tuple_type(args[5])) return NULL;
    PyObject *frames = args[0], *pending = args[1], *results = args[2], *gone = args[6];
    PyTypeObject *entry_type = (PyTypeObject *)args[5];
    long long first = PyLong_AsLongLong(args[3]);
    if (first == -1 && PyErr_Occurred()) return NULL;
    long long ledger_id = PyLong_AsLongLong(args[4]);
    if (ledger_id == -1 && PyErr_Occurred()) return NULL;
    PyObject *ledger = args[4];
    PyObject *delivered = PyList_New(0), *rest = PyList_New(0);
    if (delivered == NULL || rest == NULL) goto failed;
    Py_ssize_t count = PyList_GET_SIZE(frames), size = PyList_GET_SIZE(results);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        if (!PyBytes_Check(frame) || PyBytes_GET_SIZE(frame) < 24) {
            PyErr_SetString(PyExc_TypeError,
                            "an answer is a v2 response frame of 24 bytes or more");
            goto failed;
        }
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(frame) + 24;
        Py_ssize_t n = PyBytes_GET_SIZE(frame) - 24;
        int32_t rc = (int32_t)load_be32(p - 20);
        long long entry_id = (long long)load_be64(p - 8);
        PyObject *key = PyLong_FromLongLong(entry_id);
        if (key == NULL) goto failed;
        PyObject *attempt = PyDict_GetItemWithError(pending, key); /* borrowed */
        if (attempt == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto failed;
            }
            attempt = gone;
        }
        Py_INCREF(attempt);
        if (attempt != gone && PyDict_DelItem(pending, key) < 0) {
            Py_DECREF(attempt);
            Py_DECREF(key);
            goto failed;
        }
        long long at = entry_id - first;
        if (attempt == Py_None && rc == 0 && at >= 0 && at < size &&
            entry_checks_out(p, n, ledger_id, entry_id)) {
            PyObject *payload = PyBytes_FromStringAndSize((const char *)p + CRC_END, n - CRC_END);
            PyObject *entry = payload == NULL ? NULL : new_entry(entry_type, ledger, key, payload);
            Py_XDECREF(payload);
            Py_DECREF(attempt);
            if (entry == NULL) {
                Py_DECREF(key);
                goto failed;
            }
            PyList_SetItem(results, (Py_ssize_t)at, entry); /* steals entry */
            int appended = PyList_Append(delivered, key);
            Py_DECREF(key);
            if (appended < 0) goto failed;
            continue;
        }
        PyObject *left = Py_BuildValue("(Niy#N)", key, (int)rc, (const char *)p, n, attempt);
        if (left == NULL) goto failed;
        int appended = PyList_Append(rest, left);
        Py_DECREF(left);
        if (appended < 0) goto failed;
    }
    return Py_BuildValue("NN", delivered, rest);
failed:
    Py_XDECREF(delivered);
    Py_XDECREF(rest);
    return NULL;
}

/* crc32c_batch_entries(body, ledger_id, first_entry_id, max_count, entry_type) -> list | None:
 * the ``[int32 length][entry]`` records of a BATCH_READ_ENTRY answer body (from offset 8, after
 * the request id), each a CRC32C entry of the ledger with ids from first_entry_id on whose digest
 * checks out, made entry_type((ledger_id, entry_id, payload)); None if a record is cut short or
 * fails its check, or more follow max_count (the caller's long way then says what is wrong, and
 * serves what comes before it). */
static PyObject *crc32c_batch_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char usage[] =
        "crc32c_batch_entries(body, ledger_id, first_entry_id, max_count, entry_type)";
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (!plain_tuple_type(args[4])) return NULL;
    PyTypeObject *entry_type = (PyTypeObject *)args[4];
    long long ids[3];
    Py_buffer view;
    if (buffer_args(args, 4, usage, 3, ids, &view) < 0) return NULL; /* the four before the type */
    long long ledger_id = ids[0], entry_id = ids[1], max_count = ids[2];
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, pos = 8;
    PyObject *list = PyList_New(0);
    if (list == NULL) goto failed;
    while (pos + 4 <= n && PyList_GET_SIZE(list) < max_count) {
        int32_t length = (int32_t)load_be32(p + pos);
        pos += 4;
        if (length < 0 || length > n - pos) goto long_way;
        const uint8_t *e = p + pos;
        if (!entry_checks_out(e, length, ledger_id, entry_id)) goto long_way;
        PyObject *item =
            PyBytes_FromStringAndSize((const char *)e + CRC_END, (Py_ssize_t)length - CRC_END);
        if (item != NULL) {
            PyObject *id = PyLong_FromLongLong(entry_id);
            PyObject *entry = id == NULL ? NULL : new_entry(entry_type, args[1], id, item);
            Py_XDECREF(id);
            Py_DECREF(item);
            item = entry;
        }
        if (item == NULL) goto failed;
        int appended = PyList_Append(list, item);
        Py_DECREF(item);
        if (appended < 0) goto failed;
        pos += length;
        entry_id++;
    }
    if (pos + 4 <= n) goto long_way; /* records past max_count: the long way checks them too */
    PyBuffer_Release(&view);
    return list;
long_way:
    Py_DECREF(list);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
failed:
    Py_XDECREF(list);
    PyBuffer_Release(&view);
    return NULL;
}

/* One CRC32C entry as sent, written at q: the header of its four ids, the digest, the payload. */
static void package_into(uint8_t *q, const long long ids[4], const void *payload, Py_ssize_t n) {
    for (int i = 0; i < 4; i++) store_be64(q + 8 * i, (uint64_t)ids[i]);
    memcpy(q + CRC_END, payload, n);
    uint32_t crc = crc32c_update(0, q, HEADER);
    crc = crc32c_update(crc, q + CRC_END, n);
    store_be32(q + HEADER, crc);
}

/* crc32c_package(ledger_id, entry_id, lac, length, payload) -> bytes: the entry as sent. */
static PyObject *crc32c_package(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long ids[4];
    if (int_args(args, nargs, 5, "crc32c_package(ledger_id, entry_id, lac, length, payload)", 0,
                 4, ids) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[4], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, CRC_END + view.len);
    if (out != NULL) package_into((uint8_t *)PyBytes_AS_STRING(out), ids, view.buf, view.len);
    PyBuffer_Release(&view);
    return out;
}

/* crc32c_package_run(ledger_id, first_entry_id, lac, lengths, payloads) -> list[bytes]: the
 * entries first_entry_id, first_entry_id + 1, ... as sent, payloads[i] carrying the ledger's
 * length lengths[i] (two lists of the same size). */
static PyObject *crc32c_package_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char usage[] =
        "crc32c_package_run(ledger_id, first_entry_id, lac, lengths, payloads)";
    long long ids[4];
    if (int_args(args, nargs, 5, usage, 0, 3, ids) < 0) return NULL;
    PyObject *lengths = args[3], *payloads = args[4];
    if (!PyList_Check(lengths) || !PyList_Check(payloads) ||
        PyList_GET_SIZE(lengths) != PyList_GET_SIZE(payloads)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(payloads);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    long long entry[4] = {ids[0], ids[1], ids[2], 0};
    for (Py_ssize_t i = 0; i < count; i++, entry[1]++) {
        entry[3] = PyLong_AsLongLong(PyList_GET_ITEM(lengths, i));
        if (entry[3] == -1 && PyErr_Occurred()) goto failed;
        Py_buffer view;
        if (PyObject_GetBuffer(PyList_GET_ITEM(payloads, i), &view, PyBUF_SIMPLE) < 0)
            goto failed;
        PyObject *item = PyBytes_FromStringAndSize(NULL, CRC_END + view.len);
        if (item != NULL) package_into((uint8_t *)PyBytes_AS_STRING(item), entry, view.buf,
                                       view.len);
        PyBuffer_Release(&view);
        if (item == NULL) goto failed;
        PyList_SET_ITEM(out, i, item);
    }
    return out;
failed:
    Py_DECREF(out);
    return NULL;
}

/* entry_log_record(block, at, ledger_id, entry_id) -> bytes | None: the entry of the entry-log
 * record at ``at`` in ``block`` ([uint32 length][uint32 CRC32C of the entry][entry], the entry
 * starting with its ledger and entry ids) if the record is whole in the block, its checksum
 * matches and it is the entry asked for; None otherwise (the caller reads it the long way and
 * says what is wrong). */
static PyObject *entry_log_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long ids[3];
    Py_buffer view;
    if (buffer_args(args, nargs, "entry_log_record(block, at, ledger_id, entry_id)", 3, ids,
                    &view) < 0)
        return NULL;
    Py_ssize_t at = (Py_ssize_t)ids[0];
    long long ledger_id = ids[1], entry_id = ids[2];
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *result = NULL;
    if (at >= 0 && at <= n - 8) {
        Py_ssize_t length = (Py_ssize_t)load_be32(p + at);
        const uint8_t *entry = p + at + 8;
        if (length >= 16 && length <= n - at - 8 &&
            (long long)load_be64(entry) == ledger_id &&
            (long long)load_be64(entry + 8) == entry_id &&
            crc32c_update(0, entry, length) == load_be32(p + at + 4)) {
            result = PyBytes_FromStringAndSize((const char *)entry, length);
        }
    }
    PyBuffer_Release(&view);
    if (result == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

/* entry_log_frame(out, entries, location[, at]) -> locations: a checkpoint's batch of
 * entry-log records (storage/entry_log.py add_many), each [uint32 length][uint32 CRC32C of the
 * entry][entry], written back to back into ``out``, and the location of each record, the first
 * at ``location`` (a log id in the high 32 bits and an offset in the low ones; the records of one
 * call stay in one log). Without ``at``, ``out`` is a bytearray resized to fit them (kept by the
 * caller from one batch to the next, so its pages are not found afresh each time); with it,
 * ``out`` is any writable buffer (the page-aligned buffer of direct writes) and the records go
 * from byte ``at`` on, a ValueError if they do not fit. One system call then writes them, where
 * the Python path built two pieces per record for writev. The checksums and copies run without
 * the GIL (the bookie's loop needs it meanwhile), on entries held by a reference of the call's
 * own and into ``out``'s buffer, which cannot be resized while it is held. */
static PyObject *entry_log_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || nargs > 4 || (nargs == 3 && !PyByteArray_Check(args[0])) ||
        !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "entry_log_frame(out: bytearray, entries: list, location: int) or "
                        "entry_log_frame(out: writable buffer, entries: list, location: int, "
                        "at: int)");
        return NULL;
    }
    PyObject *out = args[0], *entries = args[1];
    long long location = PyLong_AsLongLong(args[2]);
    if (location == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t at_offset = -1; /* -1: resize the bytearray to fit */
    if (nargs == 4) {
        at_offset = PyLong_AsSsize_t(args[3]);
        if (at_offset == -1 && PyErr_Occurred()) return NULL;
        if (at_offset < 0) {
            PyErr_SetString(PyExc_ValueError, "entry_log_frame: a negative offset");
            return NULL;
        }
    }
    Py_ssize_t count = PyList_GET_SIZE(entries), total = 0, held_count = 0;
    PyObject **held = PyMem_Malloc(sizeof(*held) * (size_t)(count ? count : 1));
    if (held == NULL) return PyErr_NoMemory();
    PyObject *locations = NULL, *result = NULL;
    Py_buffer view = {0};
    /* The entries, each held by a reference of this call's own, before anything that could
     * run Python code (and change the list) */
    for (; held_count < count; held_count++) {
        PyObject *entry = PyList_GET_ITEM(entries, held_count);
        if (!PyBytes_Check(entry)) {
            PyErr_SetString(PyExc_TypeError, "an entry-log entry is bytes");
            goto done;
        }
        if (PyBytes_GET_SIZE(entry) > (Py_ssize_t)UINT32_MAX - 8) {
            PyErr_SetString(PyExc_ValueError, "an entry of 4 GiB or more has no record length");
            goto done;
        }
        Py_INCREF(entry);
        held[held_count] = entry;
        total += 8 + PyBytes_GET_SIZE(entry);
    }
    if (at_offset < 0 && PyByteArray_Resize(out, total) < 0) goto done;
    locations = PyList_New(count);
    if (locations == NULL) goto done;
    long long offset = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *place = PyLong_FromLongLong(location + offset);
        if (place == NULL) goto done;
        PyList_SET_ITEM(locations, i, place);
        offset += 8 + PyBytes_GET_SIZE(held[i]);
    }
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE) < 0) goto done;
    if (at_offset >= 0 && view.len - at_offset < total) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "entry_log_frame: the records do not fit the buffer");
        goto done;
    }
    uint8_t *at = (uint8_t *)view.buf + (at_offset < 0 ? 0 : at_offset);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(held[i]);
        Py_ssize_t n = PyBytes_GET_SIZE(held[i]);
        /* The next entry's bytes asked for meanwhile: a checkpoint's entries are a write cache's
         * worth, long out of the CPU's caches (1 KiB entries: 138-147 -> 126-137 ns each) */
        if (i + 1 < count) {
            const char *next = PyBytes_AS_STRING(held[i + 1]);
            Py_ssize_t next_n = PyBytes_GET_SIZE(held[i + 1]);
            for (Py_ssize_t line = 0; line < next_n; line += 64)
                __builtin_prefetch(next + line, 0, 0);
        }
        store_be32(at, (uint32_t)n);
        store_be32(at + 4, crc32c_update(0, p, n));
        memcpy(at + 8, p, (size_t)n);
        at += 8 + n;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    result = locations;
    locations = NULL;
done:
    for (Py_ssize_t i = 0; i < held_count; i++) Py_DECREF(held[i]);
    PyMem_Free(held);
    Py_XDECREF(locations);
    return result;
}

/* index_pairs(ledger_id, entry_ids, locations, start, stop) -> [(key, value), ...]: the LMDB
 * items of a checkpoint's slice of one ledger's entry locations (storage/index.py commit): each
 * key the big-endian (ledger id, entry id), each value the big-endian unsigned location, for
 * entry_ids[start:stop] and locations[start:stop]. */
static PyObject *index_pairs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "index_pairs(ledger_id, entry_ids: list, locations: list, start, stop)");
        return NULL;
    }
    long long ledger_id = PyLong_AsLongLong(args[0]);
    if (ledger_id == -1 && PyErr_Occurred()) return NULL;
    PyObject *ids = args[1], *places = args[2];
    Py_ssize_t start = PyLong_AsSsize_t(args[3]), stop = PyLong_AsSsize_t(args[4]);
    if ((start == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyList_GET_SIZE(ids);
    if (PyList_GET_SIZE(places) < size) size = PyList_GET_SIZE(places);
    if (start < 0) start = 0;
    if (stop > size) stop = size;
    PyObject *pairs = PyList_New(stop > start ? stop - start : 0);
    if (pairs == NULL) return NULL;
    for (Py_ssize_t i = start; i < stop; i++) {
        if (i >= PyList_GET_SIZE(ids) || i >= PyList_GET_SIZE(places)) {
            PyErr_SetString(PyExc_RuntimeError, "index_pairs: the lists changed meanwhile");
            goto failed;
        }
        if (!PyLong_Check(PyList_GET_ITEM(ids, i)) || !PyLong_Check(PyList_GET_ITEM(places, i))) {
            PyErr_SetString(PyExc_TypeError, "index_pairs: entry ids and locations are ints");
            goto failed;
        }
        long long entry_id = PyLong_AsLongLong(PyList_GET_ITEM(ids, i));
        if (entry_id == -1 && PyErr_Occurred()) goto failed;
        unsigned long long location = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(places, i));
        if (location == (unsigned long long)-1 && PyErr_Occurred()) goto failed;
        PyObject *key = PyBytes_FromStringAndSize(NULL, 16);
        PyObject *value = PyBytes_FromStringAndSize(NULL, 8);
        PyObject *pair = (key == NULL || value == NULL) ? NULL : PyTuple_New(2);
        if (pair == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            goto failed;
        }
        store_be64((uint8_t *)PyBytes_AS_STRING(key), (uint64_t)ledger_id);
        store_be64((uint8_t *)PyBytes_AS_STRING(key) + 8, (uint64_t)entry_id);
        store_be64((uint8_t *)PyBytes_AS_STRING(value), (uint64_t)location);
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyList_SET_ITEM(pairs, i - start, pair);
    }
    return pairs;
failed:
    Py_DECREF(pairs);
    return NULL;
}

/* entry_log_pick(block, at, ledger_id, wanted, start, max_bytes) -> (entries, index, at): a walk
 * over the entry-log records that follow one another in ``block`` from ``at``, all of the ledger
 * and with increasing entry ids (one checkpoint's records of it), taking the checked entries of
 * the ids ``wanted[start]``, ``wanted[start + 1]``, ... (a list of increasing ints: a batch
 * read's consecutive ids, or the every E-th entry of a striped read) as long as they fit in
 * ``max_bytes`` counting 4 bytes more per entry (a batch read answer's framing), and stepping
 * over the records of other ids. Stops at a record not whole in the block, another ledger's, one
 * whose id does not increase, one past a wanted id not met, or a wanted one that does not fit or
 * whose checksum fails (the one-entry path reads that and reports it); returns the entries
 * taken, the index in ``wanted`` of the first not taken and where the record the walk stopped at
 * begins. */
static PyObject *entry_log_pick(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "entry_log_pick(block, at, ledger_id, wanted: list, start, max_bytes)");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    long long ledger_id = PyLong_AsLongLong(args[2]);
    Py_ssize_t index = PyLong_AsSsize_t(args[4]);
    long long budget = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    PyObject *wanted = args[3];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, count = PyList_GET_SIZE(wanted);
    PyObject *entries = PyList_New(0);
    if (entries == NULL) goto fail;
    if (at < 0 || at > n || index < 0) {
        PyErr_SetString(PyExc_ValueError, "entry_log_pick: at or start out of range");
        goto fail;
    }
    long long last = -1;
    while (index < count && at <= n - 8) {
        long long want = PyLong_AsLongLong(PyList_GET_ITEM(wanted, index));
        if (want == -1 && PyErr_Occurred()) goto fail;
        Py_ssize_t length = (Py_ssize_t)load_be32(p + at);
        const uint8_t *entry = p + at + 8;
        if (length < 16 || length > n - at - 8 || (long long)load_be64(entry) != ledger_id)
            break;
        long long id = (long long)load_be64(entry + 8);
        if (id <= last || id > want) break;
        if (id == want) {
            if (budget < 4 + (long long)length ||
                crc32c_update(0, entry, length) != load_be32(p + at + 4))
                break;
            PyObject *item = PyBytes_FromStringAndSize((const char *)entry, length);
            if (item == NULL || PyList_Append(entries, item) < 0) {
                Py_XDECREF(item);
                goto fail;
            }
            Py_DECREF(item);
            budget -= 4 + length;
            index++;
        }
        last = id;
        at += 8 + length;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nnn)", entries, index, at);
fail:
    Py_XDECREF(entries);
    PyBuffer_Release(&view);
    return NULL;
}

/* The next frame of a bookie's run of plain requests (take_plain_reads, take_plain_adds): the
 * frame at the head of the deque ``backlog``, taken off it (``popleft``: its bound method) if it
 * is bytes that start with ``head`` and are ``size`` bytes long (``exact``) or at least that;
 * NULL when it is not (or the backlog is empty), with an error set only on a failure. */
static PyObject *next_plain(PyObject *backlog, PyObject *popleft, const char *head,
                            Py_ssize_t head_size, Py_ssize_t size, int exact) {
    if (PyObject_Length(backlog) <= 0) return NULL;
    PyObject *next = PySequence_GetItem(backlog, 0);
    if (next == NULL) return NULL;
    Py_ssize_t n = PyBytes_Check(next) ? PyBytes_GET_SIZE(next) : -1;
    int plain = (exact ? n == size : n >= size) && memcmp(PyBytes_AS_STRING(next), head,
                                                          head_size) == 0;
    Py_DECREF(next);
    if (!plain) return NULL;
    PyObject *frame = PyObject_CallNoArgs(popleft);
    if (frame != NULL && !PyBytes_Check(frame)) {
        Py_DECREF(frame);
        PyErr_SetString(PyExc_TypeError, "a bookie's backlog changed while a run was taken");
        return NULL;
    }
    return frame;
}

/* take_plain_reads(backlog, first, room, head, size) -> (groups, count): a bookie's run of plain
 * v2 reads (server/connection.py): ``first`` (one, taken off the backlog already) and those
 * right behind it in the deque ``backlog`` (frames of ``size`` bytes that start with the 4
 * bytes ``head``: header, ledger id, entry id), taken off it up to ``room`` frames in all;
 * ``groups`` holds (ledger id, [entry ids]) for each stretch of one ledger, in order, and
 * ``count`` how many frames were taken. */
static PyObject *take_plain_reads(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_Check(args[1]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "take_plain_reads(backlog, first: bytes, room, head: bytes, size)");
        return NULL;
    }
    Py_ssize_t room = PyLong_AsSsize_t(args[2]), size = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    const char *head = PyBytes_AS_STRING(args[3]);
    Py_ssize_t head_size = PyBytes_GET_SIZE(args[3]);
    if (size < head_size + 16 || head_size > 8) {
        PyErr_SetString(PyExc_ValueError, "take_plain_reads: size too small for the ids");
        return NULL;
    }
    PyObject *popleft = PyObject_GetAttrString(args[0], "popleft");
    if (popleft == NULL) return NULL;
    PyObject *groups = PyList_New(0), *ids = NULL, *frame = args[1];
    Py_INCREF(frame);
    long long ledger_id = 0;
    Py_ssize_t count = 0;
    if (groups == NULL) goto failed;
    for (;;) {
        if (PyBytes_GET_SIZE(frame) != size) {  /* ``first`` is checked by the caller */
            PyErr_SetString(PyExc_ValueError, "take_plain_reads: not a plain read");
            goto failed;
        }
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(frame) + head_size;
        long long lid = (long long)load_be64(p), eid = (long long)load_be64(p + 8);
        Py_DECREF(frame);
        frame = NULL;
        if (ids == NULL || lid != ledger_id) {
            ids = PyList_New(0);
            PyObject *group = ids != NULL ? Py_BuildValue("(LN)", lid, ids) : NULL;
            if (group == NULL || PyList_Append(groups, group) < 0) {
                Py_XDECREF(group);
                goto failed;
            }
            Py_DECREF(group);  /* ``ids`` lives on in it */
            ledger_id = lid;
        }
        PyObject *entry = PyLong_FromLongLong(eid);
        if (entry == NULL || PyList_Append(ids, entry) < 0) {
            Py_XDECREF(entry);
            goto failed;
        }
        Py_DECREF(entry);
        if (++count >= room) break;
        frame = next_plain(args[0], popleft, head, head_size, size, 1);
        if (frame == NULL) {
            if (PyErr_Occurred()) goto failed;
            break;
        }
    }
    Py_DECREF(popleft);
    return Py_BuildValue("(Nn)", groups, count);
failed:
    Py_XDECREF(frame);
    Py_XDECREF(groups);
    Py_DECREF(popleft);
    return NULL;
}

/* v2_answers(ledger_id, entry_ids, entries, statuses, header) -> bytes: the framed v2 answers
 * (length, header, rc, ledger id, entry id, then for a read its entry) to requests of one
 * ledger, in order. For reads ``entries`` is a list of bytes (empty where the read failed), one
 * answer each, to ``entry_ids[i]``, and ``statuses`` a dict of the failed ones' index -> v2
 * return code (the rest are 0, EOK); for adds ``entries`` is None, one answer per entry id, and
 * ``statuses`` the return code of them all. None when an entry is not bytes (another buffer
 * type: the Python path takes those). */
static PyObject *v2_answers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_Check(args[1]) ||
        !(PyList_Check(args[2]) ? PyDict_Check(args[3])
                                : args[2] == Py_None && PyLong_Check(args[3]))) {
        PyErr_SetString(PyExc_TypeError,
                        "v2_answers(ledger_id, entry_ids: list, entries: list, statuses: dict, "
                        "header) or (ledger_id, entry_ids: list, None, rc: int, header)");
        return NULL;
    }
    long long ledger_id = PyLong_AsLongLong(args[0]);
    long header = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    PyObject *ids = args[1], *entries = args[2] == Py_None ? NULL : args[2];
    PyObject *statuses = entries != NULL ? args[3] : NULL;
    long all_rc = entries == NULL ? PyLong_AsLong(args[3]) : 0;
    if (all_rc == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = entries != NULL ? PyList_GET_SIZE(entries) : PyList_GET_SIZE(ids);
    Py_ssize_t total = 28 * count;
    if (PyList_GET_SIZE(ids) < count) {
        PyErr_SetString(PyExc_ValueError, "v2_answers: more entries than entry ids");
        return NULL;
    }
    for (Py_ssize_t i = 0; entries != NULL && i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (!PyBytes_Check(entry)) Py_RETURN_NONE; /* another buffer type: the Python path's */
        total += PyBytes_GET_SIZE(entry);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    const int any_failed = statuses != NULL && PyDict_GET_SIZE(statuses) > 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long entry_id = PyLong_AsLongLong(PyList_GET_ITEM(ids, i));
        if (entry_id == -1 && PyErr_Occurred()) goto failed;
        long rc = all_rc;
        if (any_failed) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL) goto failed;
            PyObject *code = PyDict_GetItemWithError(statuses, index);
            Py_DECREF(index);
            if (code != NULL) rc = PyLong_AsLong(code);
            if (PyErr_Occurred()) goto failed;
        }
        PyObject *entry = entries != NULL ? PyList_GET_ITEM(entries, i) : NULL;
        Py_ssize_t n = entry != NULL ? PyBytes_GET_SIZE(entry) : 0;
        store_be32(p, (uint32_t)(24 + n));
        store_be32(p + 4, (uint32_t)header);
        store_be32(p + 8, (uint32_t)rc);
        store_be64(p + 12, (uint64_t)ledger_id);
        store_be64(p + 20, (uint64_t)entry_id);
        if (n > 0) memcpy(p + 28, PyBytes_AS_STRING(entry), n);
        p += 28 + n;
    }
    return out;
failed:
    Py_DECREF(out);
    return NULL;
}

/* v2_batch_answer(head, entries) -> bytes | None: a framed BATCH_READ_ENTRY answer, ``head``
 * (its fixed part and request id, packed with any frame length: the right one is written here)
 * followed by each entry of the list ``entries`` as [4-byte length][entry]. None when an entry
 * is not bytes (another buffer type: the Python path takes those). */
static PyObject *v2_batch_answer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_Check(args[1]) ||
        PyBytes_GET_SIZE(args[0]) < 4) {
        PyErr_SetString(PyExc_TypeError, "v2_batch_answer(head: bytes, entries: list)");
        return NULL;
    }
    PyObject *entries = args[1];
    Py_ssize_t head = PyBytes_GET_SIZE(args[0]), count = PyList_GET_SIZE(entries);
    Py_ssize_t total = head + 4 * count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (!PyBytes_Check(entry)) Py_RETURN_NONE;
        total += PyBytes_GET_SIZE(entry);
    }
    if (total - 4 > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "v2_batch_answer: longer than a frame can say");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    memcpy(p, PyBytes_AS_STRING(args[0]), head);
    store_be32(p, (uint32_t)(total - 4));
    p += head;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        Py_ssize_t n = PyBytes_GET_SIZE(entry);
        store_be32(p, (uint32_t)n);
        memcpy(p + 4, PyBytes_AS_STRING(entry), n);
        p += 4 + n;
    }
    return out;
}

/* Appends (ledger id, key, ids, entries, LAC or None when ``lac`` is NULL) to ``groups``,
 * taking the references of ``*key``, ``*ids`` and ``*entries`` (set to NULL); 0, or -1 with the
 * error set. */
static int close_add_group(PyObject *groups, long long ledger_id, PyObject **key, PyObject **ids,
                           PyObject **entries, const long long *lac) {
    PyObject *id = PyLong_FromLongLong(ledger_id);
    PyObject *value = lac != NULL ? PyLong_FromLongLong(*lac) : Py_NewRef(Py_None);
    PyObject *group =
        id != NULL && value != NULL ? PyTuple_Pack(5, id, *key, *ids, *entries, value) : NULL;
    Py_XDECREF(id);
    Py_XDECREF(value);
    if (group == NULL) return -1;
    Py_CLEAR(*key);
    Py_CLEAR(*ids);
    Py_CLEAR(*entries);
    int stored = PyList_Append(groups, group);
    Py_DECREF(group);
    return stored;
}

/* A run of plain v2 adds being grouped (take_plain_adds, cut_plain_adds): ``groups`` so far,
 * and the open group's key, ids and entries (owned here until it is closed), ledger id and
 * highest LAC (``lac_known`` 0 once an entry cannot carry one). */
typedef struct {
    PyObject *groups, *key, *ids, *entries;
    long long ledger_id, lac;
    int lac_known;
} AddRun;

/* Adds the plain add frame ``p`` (``size`` bytes, at least head, key and the two ids) to the
 * run: a new group when its ledger or master key differs from the open one's; 0, or -1 with
 * the error set. */
static int add_run_take(AddRun *run, const uint8_t *p, Py_ssize_t size, Py_ssize_t head_size) {
    const Py_ssize_t key_size = 20, at = head_size + key_size; /* where the entry begins */
    long long lid = (long long)load_be64(p + at), eid = (long long)load_be64(p + at + 8);
    if (run->key == NULL || lid != run->ledger_id ||
        memcmp(PyBytes_AS_STRING(run->key), p + head_size, key_size) != 0) {
        if (run->key != NULL &&
            close_add_group(run->groups, run->ledger_id, &run->key, &run->ids, &run->entries,
                            run->lac_known ? &run->lac : NULL) < 0)
            return -1;
        run->key = PyBytes_FromStringAndSize((const char *)p + head_size, key_size);
        run->ids = PyList_New(0);
        run->entries = PyList_New(0);
        if (run->key == NULL || run->ids == NULL || run->entries == NULL) return -1;
        run->ledger_id = lid;
        run->lac_known = 1;
        run->lac = LLONG_MIN;
    }
    if (size < at + 24 || eid < 0) {
        run->lac_known = 0;
    } else if ((long long)load_be64(p + at + 16) > run->lac) {
        run->lac = (long long)load_be64(p + at + 16);
    }
    PyObject *entry_id = PyLong_FromLongLong(eid);
    int stored = entry_id != NULL ? PyList_Append(run->ids, entry_id) : -1;
    Py_XDECREF(entry_id);
    PyObject *entry = stored == 0 ? PyBytes_FromStringAndSize((const char *)p + at, size - at)
                                  : NULL;
    stored = entry != NULL ? PyList_Append(run->entries, entry) : -1;
    Py_XDECREF(entry);
    return stored;
}

/* The run's groups (a new reference), its open group closed; NULL with the error set. */
static PyObject *add_run_groups(AddRun *run) {
    if (run->key != NULL && close_add_group(run->groups, run->ledger_id, &run->key, &run->ids,
                                            &run->entries, run->lac_known ? &run->lac : NULL) < 0)
        return NULL;
    return Py_NewRef(run->groups);
}

static void add_run_clear(AddRun *run) {
    Py_CLEAR(run->groups);
    Py_CLEAR(run->key);
    Py_CLEAR(run->ids);
    Py_CLEAR(run->entries);
}

/* Checks the (head, min_size) arguments of take_plain_adds and cut_plain_adds; 0, or -1 with
 * the error set. */
static int plain_add_shape(PyObject *head, Py_ssize_t min_size) {
    if (PyBytes_GET_SIZE(head) > 8 || min_size < PyBytes_GET_SIZE(head) + 20 + 16) {
        PyErr_SetString(PyExc_ValueError, "plain adds: min_size too small for the ids");
        return -1;
    }
    return 0;
}

/* take_plain_adds(backlog, first, room, head, min_size) -> (groups, count): a bookie's run of
 * plain v2 adds (server/connection.py): ``first`` (taken off the backlog already) and those right
 * behind it in the deque ``backlog`` (frames of at least ``min_size`` bytes that start with the
 * 4 bytes ``head``: header, master key (20), entry starting with ledger id, entry id, LAC), taken
 * off it up to ``room`` frames in all. ``groups`` holds, for each stretch of one ledger and one
 * master key, (ledger id, master key, [entry ids], [entries], LAC): the entries cut out of their
 * frames, and the highest LAC among them, or None when an entry is too short to hold one or an
 * entry id is negative (then the caller checks them one by one); ``count`` how many frames were
 * taken. */
static PyObject *take_plain_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyBytes_Check(args[1]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "take_plain_adds(backlog, first: bytes, room, head: bytes, min_size)");
        return NULL;
    }
    Py_ssize_t room = PyLong_AsSsize_t(args[2]), min_size = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred() || plain_add_shape(args[3], min_size) < 0) return NULL;
    const char *head = PyBytes_AS_STRING(args[3]);
    Py_ssize_t head_size = PyBytes_GET_SIZE(args[3]);
    PyObject *popleft = PyObject_GetAttrString(args[0], "popleft");
    if (popleft == NULL) return NULL;
    AddRun run = {PyList_New(0), NULL, NULL, NULL, 0, LLONG_MIN, 1};
    PyObject *frame = Py_NewRef(args[1]), *groups = NULL;
    Py_ssize_t count = 0;
    if (run.groups == NULL) goto done;
    for (;;) {
        if (PyBytes_GET_SIZE(frame) < min_size) { /* ``first`` is checked by the caller */
            PyErr_SetString(PyExc_ValueError, "take_plain_adds: not a plain add");
            goto done;
        }
        if (add_run_take(&run, (const uint8_t *)PyBytes_AS_STRING(frame),
                         PyBytes_GET_SIZE(frame), head_size) < 0)
            goto done;
        Py_CLEAR(frame);
        if (++count >= room) break;
        frame = next_plain(args[0], popleft, head, head_size, min_size, 0);
        if (frame == NULL) {
            if (PyErr_Occurred()) goto done;
            break;
        }
    }
    groups = add_run_groups(&run);
done:
    Py_XDECREF(frame);
    add_run_clear(&run);
    Py_DECREF(popleft);
    return groups == NULL ? NULL : Py_BuildValue("(Nn)", groups, count);
}

/* cut_plain_adds(data, start, room, head, min_size, max_frame) -> (groups, count, position): a
 * bookie's run of plain v2 adds cut straight out of the bytes ``data`` it received, from
 * ``start`` on: the whole length-prefixed frames there (of at most ``max_frame`` bytes) that are
 * plain adds (as take_plain_adds: at least ``min_size`` bytes, starting with ``head``), up to
 * ``room`` of them; ``groups`` as take_plain_adds gives them, ``count`` how many frames were
 * taken and ``position`` where the first frame not taken (or the bytes after the last) begins.
 * No frame is copied out on the way: each entry is the one copy. */
static PyObject *cut_plain_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "cut_plain_adds(data: bytes, start, room, head: bytes, min_size, "
                        "max_frame)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), room = PyLong_AsSsize_t(args[2]);
    Py_ssize_t min_size = PyLong_AsSsize_t(args[4]), max_frame = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred() || plain_add_shape(args[3], min_size) < 0) return NULL;
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    const Py_ssize_t end = PyBytes_GET_SIZE(args[0]), head_size = PyBytes_GET_SIZE(args[3]);
    if (start < 0 || start > end) {
        PyErr_SetString(PyExc_ValueError, "cut_plain_adds: start out of range");
        return NULL;
    }
    AddRun run = {PyList_New(0), NULL, NULL, NULL, 0, LLONG_MIN, 1};
    PyObject *groups = NULL;
    Py_ssize_t position = start, count = 0;
    if (run.groups == NULL) goto done;
    while (count < room && end - position >= 4) {
        Py_ssize_t length = (Py_ssize_t)load_be32(data + position);
        const uint8_t *frame = data + position + 4;
        if (length > max_frame || length > end - position - 4 || length < min_size ||
            memcmp(frame, PyBytes_AS_STRING(args[3]), head_size) != 0)
            break;
        if (add_run_take(&run, frame, length, head_size) < 0) goto done;
        position += 4 + length;
        count++;
    }
    groups = add_run_groups(&run);
done:
    add_run_clear(&run);
    return groups == NULL ? NULL : Py_BuildValue("(Nnn)", groups, count, position);
}

/* A journal's run of ENTRY records appended together (storage/journal.py ``_ENTRIES``): a record
 * (JOURNAL_RUN, [bodies], token, background) that the group writes as one ENTRY record a body. */
#define JOURNAL_RUN 256
#define JOURNAL_ENTRY 1

/* journal_group(batch, gather_min) -> (pieces, tokens) | None: one journal group
 * (storage/journal.py) of the records in ``batch`` ((type, body, token, background) tuples, or
 * runs: (JOURNAL_RUN, [bodies], token, background), one ENTRY record a body), as the pieces to
 * write in order: the group's header, count, types and lengths, then the bodies joined in the
 * same bytes when they average under ``gather_min`` bytes, else each body a piece of its own (the
 * CRC computed over them where they are); and the records' tokens that are not None, in order.
 * None when a body is not bytes (a buffer of another type: the Python path takes those). */
static PyObject *journal_group(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "journal_group(batch: list, gather_min)");
        return NULL;
    }
    Py_ssize_t gather_min = PyLong_AsSsize_t(args[1]);
    if (gather_min == -1 && PyErr_Occurred()) return NULL;
    PyObject *batch = args[0];
    Py_ssize_t items = PyList_GET_SIZE(batch), count = 0, size = 0;
    for (Py_ssize_t i = 0; i < items; i++) {
        PyObject *record = PyList_GET_ITEM(batch, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 3 ||
            !PyLong_Check(PyTuple_GET_ITEM(record, 0))) {
            PyErr_SetString(PyExc_TypeError, "journal_group: records are (type, body, token, ...)");
            return NULL;
        }
        PyObject *body = PyTuple_GET_ITEM(record, 1);
        if (PyList_Check(body)) { /* a run (its type is checked below) */
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(body); j++) {
                PyObject *entry = PyList_GET_ITEM(body, j);
                if (!PyBytes_Check(entry)) Py_RETURN_NONE;
                size += PyBytes_GET_SIZE(entry);
            }
            count += PyList_GET_SIZE(body);
            continue;
        }
        if (!PyBytes_Check(body)) Py_RETURN_NONE; /* the Python path's */
        size += PyBytes_GET_SIZE(body);
        count++;
    }
    const int gather = size < gather_min * count;
    const Py_ssize_t prefix = 8 + 4 + 5 * count;
    PyObject *tokens = PyList_New(0);
    PyObject *pieces = PyList_New(0);
    PyObject *first = PyBytes_FromStringAndSize(NULL, prefix + (gather ? size : 0));
    if (tokens == NULL || pieces == NULL || first == NULL) goto failed;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(first);
    store_be32(out + 8, (uint32_t)count);
    uint8_t *types = out + 12, *lengths = out + 12 + count, *bodies = out + prefix;
    Py_ssize_t at = 0; /* the record being described */
    for (Py_ssize_t i = 0; i < items; i++) {
        PyObject *record = PyList_GET_ITEM(batch, i);
        PyObject *body = PyTuple_GET_ITEM(record, 1), *token = PyTuple_GET_ITEM(record, 2);
        long type = PyLong_AsLong(PyTuple_GET_ITEM(record, 0));
        if (type == -1 && PyErr_Occurred()) goto failed;
        int run = PyList_Check(body);
        if (run != (type == JOURNAL_RUN)) {
            PyErr_SetString(PyExc_TypeError, "journal_group: a run's body is a list, only a run's");
            goto failed;
        }
        Py_ssize_t n_bodies = run ? PyList_GET_SIZE(body) : 1;
        for (Py_ssize_t j = 0; j < n_bodies; j++, at++) {
            PyObject *one = run ? PyList_GET_ITEM(body, j) : body;
            Py_ssize_t n = PyBytes_GET_SIZE(one);
            types[at] = (uint8_t)(run ? JOURNAL_ENTRY : type);
            store_be32(lengths + 4 * at, (uint32_t)n);
            if (gather) {
                memcpy(bodies, PyBytes_AS_STRING(one), n);
                bodies += n;
            }
        }
        if (token != Py_None && PyList_Append(tokens, token) < 0) goto failed;
    }
    uint32_t crc = crc32c_update(0, out + 8, prefix - 8 + (gather ? size : 0));
    if (PyList_Append(pieces, first) < 0) goto failed;
    for (Py_ssize_t i = 0; !gather && i < items; i++) {
        PyObject *body = PyTuple_GET_ITEM(PyList_GET_ITEM(batch, i), 1);
        int run = PyList_Check(body);
        Py_ssize_t n_bodies = run ? PyList_GET_SIZE(body) : 1;
        for (Py_ssize_t j = 0; j < n_bodies; j++) {
            PyObject *one = run ? PyList_GET_ITEM(body, j) : body;
            crc = crc32c_update(crc, (const uint8_t *)PyBytes_AS_STRING(one),
                                PyBytes_GET_SIZE(one));
            if (PyList_Append(pieces, one) < 0) goto failed;
        }
    }
    store_be32(out, (uint32_t)(prefix - 8 + size));
    store_be32(out + 4, crc);
    Py_DECREF(first);
    return Py_BuildValue("(NN)", pieces, tokens);
failed:
    Py_XDECREF(tokens);
    Py_XDECREF(pieces);
    Py_XDECREF(first);
    return NULL;
}

/* group_adds(entry_ids, targets, entries, head, batches, start) -> int: a v2 writer's sends of
 * one pass grouped by bookie (client/ledger.py WriteHandle._send_batches): from ``start`` on,
 * each entry id's packaged entry (``entries[entry_id]``; skipped when gone: failed before it
 * went out) goes to every (index, bookie) of its ``targets[i]``, whose batch in ``batches`` (made
 * when missing: ([entry ids], [chunks])) gets the id and the chunks ``head``, entry. ``head`` is
 * the request head for entries of its length (``add_request_head``); the index of the first
 * entry of another length is returned, for the caller to go on with its head (or the count once
 * done). */
static PyObject *group_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyDict_Check(args[2]) || !PyBytes_Check(args[3]) || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "group_adds(entry_ids: list, targets: list, entries: dict, head: bytes, "
                        "batches: dict, start)");
        return NULL;
    }
    PyObject *ids = args[0], *targets = args[1], *entries = args[2], *head = args[3];
    PyObject *batches = args[4];
    Py_ssize_t start = PyLong_AsSsize_t(args[5]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(ids);
    if (PyList_GET_SIZE(targets) != count || start < 0) {
        PyErr_SetString(PyExc_ValueError, "group_adds: one target tuple per entry id");
        return NULL;
    }
    /* the head's frame length says the entry length it is for */
    if (PyBytes_GET_SIZE(head) < 8) {
        PyErr_SetString(PyExc_ValueError, "group_adds: not a request head");
        return NULL;
    }
    const Py_ssize_t length =
        (Py_ssize_t)load_be32((const uint8_t *)PyBytes_AS_STRING(head)) -
        (PyBytes_GET_SIZE(head) - 4);
    PyObject *last_target = NULL, *last_batch_ids = NULL, *last_chunks = NULL;
    Py_ssize_t i = start;
    for (; i < count; i++) {
        PyObject *entry_id = PyList_GET_ITEM(ids, i);
        PyObject *entry = PyDict_GetItemWithError(entries, entry_id);
        if (entry == NULL) {
            if (PyErr_Occurred()) return NULL;
            continue;
        }
        if (!PyBytes_Check(entry) || PyBytes_GET_SIZE(entry) != length) break;
        PyObject *to = PyList_GET_ITEM(targets, i);
        if (!PyTuple_Check(to)) {
            PyErr_SetString(PyExc_TypeError, "group_adds: targets must be tuples");
            return NULL;
        }
        for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(to); t++) {
            PyObject *target = PyTuple_GET_ITEM(to, t), *batch_ids, *chunks;
            if (target == last_target) { /* the same write set as the entry before: common */
                batch_ids = last_batch_ids;
                chunks = last_chunks;
            } else {
                PyObject *batch = PyDict_GetItemWithError(batches, target);
                if (batch == NULL) {
                    if (PyErr_Occurred()) return NULL;
                    batch = Py_BuildValue("(NN)", PyList_New(0), PyList_New(0));
                    if (batch == NULL) return NULL;
                    int stored = PyDict_SetItem(batches, target, batch);
                    Py_DECREF(batch); /* held by the dict */
                    if (stored < 0) return NULL;
                }
                batch_ids = PyTuple_GET_ITEM(batch, 0);
                chunks = PyTuple_GET_ITEM(batch, 1);
                if (t == 0) {
                    last_target = target;
                    last_batch_ids = batch_ids;
                    last_chunks = chunks;
                }
            }
            if (PyList_Append(batch_ids, entry_id) < 0 || PyList_Append(chunks, head) < 0 ||
                PyList_Append(chunks, entry) < 0)
                return NULL;
        }
    }
    return PyLong_FromSsize_t(i);
}

/* complete_adds(entries, futures, first, last, future_type, ready) -> None: a writer's adds
 * ``first``..``last`` acknowledged (client/ledger.py WriteHandle._execute): each one's packaged
 * entry dropped from ``entries`` and what waits for it taken from ``futures``: a future (an
 * instance of ``future_type``) is given its entry id unless done already (cancelled by its
 * caller); anything else is an add's callback, appended to the list ``ready`` as (callback,
 * entry id, None) for the caller to call once its pass is over. */
static PyObject *complete_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long ints[2];
    if (int_args(args, nargs, 6,
                 "complete_adds(entries: dict, futures: dict, first, last, future_type, "
                 "ready: list)",
                 2, 2, ints) < 0)
        return NULL;
    if (!PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyType_Check(args[4]) ||
        !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "complete_adds: entries and futures must be dicts, future_type a type "
                        "and ready a list");
        return NULL;
    }
    PyTypeObject *future_type = (PyTypeObject *)args[4];
    PyObject *ready = args[5];
    static PyObject *done_name = NULL, *set_result_name = NULL;
    if (done_name == NULL) {
        done_name = PyUnicode_InternFromString("done");
        set_result_name = PyUnicode_InternFromString("set_result");
        if (done_name == NULL || set_result_name == NULL) return NULL;
    }
    for (long long id = ints[0]; id <= ints[1]; id++) {
        PyObject *key = PyLong_FromLongLong(id);
        if (key == NULL) return NULL;
        if (PyDict_DelItem(args[0], key) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) goto failed;
            PyErr_Clear();
        }
        PyObject *future = PyDict_GetItemWithError(args[1], key);
        if (future == NULL) {
            if (PyErr_Occurred()) goto failed;
            Py_DECREF(key);
            continue;
        }
        Py_INCREF(future);
        if (PyDict_DelItem(args[1], key) < 0) {
            Py_DECREF(future);
            goto failed;
        }
        if (!PyObject_TypeCheck(future, future_type)) { /* an add's callback */
            PyObject *call = PyTuple_Pack(3, future, key, Py_None);
            Py_DECREF(future);
            int appended = call != NULL ? PyList_Append(ready, call) : -1;
            Py_XDECREF(call);
            if (appended < 0) goto failed;
            Py_DECREF(key);
            continue;
        }
        PyObject *done = PyObject_CallMethodNoArgs(future, done_name);
        int finished = done != NULL ? PyObject_IsTrue(done) : -1;
        Py_XDECREF(done);
        PyObject *result = finished == 0 ? PyObject_CallMethodOneArg(future, set_result_name, key)
                                         : NULL;
        Py_DECREF(future);
        if (finished < 0 || (finished == 0 && result == NULL)) goto failed;
        Py_XDECREF(result);
        Py_DECREF(key);
        continue;
    failed:
        Py_DECREF(key);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* split_frames(data, start, max_frame) -> (frames, position): the whole length-prefixed frames
 * (wire/framing.py: a 4-byte big-endian length, then the frame) of the bytes object ``data``
 * from ``start``, each as bytes, and where the first that is not whole (or declares more than
 * ``max_frame`` bytes) begins: the caller's own loop takes it from there, keeping a partial
 * frame and raising on a frame too large. */
static PyObject *split_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long ints[2];
    if (int_args(args, nargs, 3, "split_frames(data, start, max_frame)", 1, 2, ints) < 0)
        return NULL;
    if (!PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "split_frames: data must be bytes");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), pos = (Py_ssize_t)ints[0];
    long long max_frame = ints[1];
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "split_frames: start outside the data");
        return NULL;
    }
    PyObject *frames = PyList_New(0);
    if (frames == NULL) return NULL;
    while (n - pos >= 4) {
        Py_ssize_t length = (Py_ssize_t)load_be32(p + pos);
        if ((long long)length > max_frame || length > n - pos - 4) break;
        PyObject *frame = PyBytes_FromStringAndSize((const char *)p + pos + 4, length);
        if (frame == NULL || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            Py_DECREF(frames);
            return NULL;
        }
        Py_DECREF(frame);
        pos += 4 + length;
    }
    return Py_BuildValue("(Nn)", frames, pos);
}

/* Appends ``item`` to the list under ``key`` in the dict ``groups`` (made if missing); 0 or -1. */
static int append_grouped(PyObject *groups, PyObject *key, PyObject *item) {
    PyObject *items = PyDict_GetItemWithError(groups, key); /* borrowed */
    if (items != NULL) return PyList_Append(items, item);
    if (PyErr_Occurred()) return -1;
    items = PyList_New(1);
    if (items == NULL) return -1;
    Py_INCREF(item);
    PyList_SET_ITEM(items, 0, item);
    int set = PyDict_SetItem(groups, key, items);
    Py_DECREF(items);
    return set;
}

/* v2_take_answers(frames, pending, add_sink_type, read_sink_type) -> (acks, reads, stop): a
 * client's pass over v2 answers (client/connection.py), for the common run of them: successful
 * add answers (a v2 header with a version, ADD_ENTRY, return code 0) whose request,
 * pending[(1, ledger id)][entry id], is a tuple whose first item is an ``add_sink_type``, and
 * read answers (READ_ENTRY, any return code) whose request, pending[(2, ledger id)][entry id],
 * is one whose first item is a ``read_sink_type``. Each such request is taken out of its row
 * (rows left empty stay: the caller drops them); an ack's entry id goes to acks[sink], a read
 * answer's frame to reads[sink] (dicts of lists, in the order answered). A run of answers of
 * one ledger looks its row up once. Stops at the first frame that is anything else (short, a
 * refusal, another kind of answer, nobody waiting) and says where: the caller's own loop takes
 * it from there. ``pending`` must hold one request per key. */
static PyObject *v2_take_answers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) ||
        !PyType_Check(args[2]) || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "v2_take_answers(frames: list, pending: dict, add_sink_type, "
                        "read_sink_type)");
        return NULL;
    }
    PyObject *frames = args[0], *pending = args[1];
    PyTypeObject *add_type = (PyTypeObject *)args[2], *read_type = (PyTypeObject *)args[3];
    PyObject *acks = PyDict_New(), *reads = PyDict_New();
    PyObject *row = NULL; /* a strong reference: the row of (row_opcode, row_ledger) */
    int row_opcode = 0;
    uint64_t row_ledger = 0;
    if (acks == NULL || reads == NULL) goto failed;
    Py_ssize_t i, n = PyList_GET_SIZE(frames);
    for (i = 0; i < n; i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        if (!PyBytes_Check(frame) || PyBytes_GET_SIZE(frame) < 24) break;
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(frame);
        int opcode = p[1];
        int32_t rc = (int32_t)load_be32(p + 4);
        if (p[0] == 0 || (opcode != 1 && opcode != 2) || (opcode == 1 && rc != 0)) break;
        uint64_t ledger_id = load_be64(p + 8);
        if (row == NULL || opcode != row_opcode || ledger_id != row_ledger) {
            Py_CLEAR(row);
            PyObject *key = Py_BuildValue("(iL)", opcode, (long long)ledger_id);
            if (key == NULL) goto failed;
            row = PyDict_GetItemWithError(pending, key); /* borrowed */
            Py_DECREF(key);
            if (row == NULL) {
                if (PyErr_Occurred()) goto failed;
                break; /* nobody waits for this ledger */
            }
            if (!PyDict_Check(row)) {
                row = NULL;
                break;
            }
            Py_INCREF(row);
            row_opcode = opcode;
            row_ledger = ledger_id;
        }
        PyObject *entry = PyLong_FromLongLong((long long)load_be64(p + 16));
        if (entry == NULL) goto failed;
        PyObject *request = PyDict_GetItemWithError(row, entry); /* borrowed */
        PyObject *sink = NULL;
        if (request != NULL && PyTuple_Check(request) && PyTuple_GET_SIZE(request) > 0) {
            sink = PyTuple_GET_ITEM(request, 0);
            if (!PyObject_TypeCheck(sink, opcode == 1 ? add_type : read_type)) sink = NULL;
        }
        if (sink == NULL) {
            Py_DECREF(entry);
            if (PyErr_Occurred()) goto failed;
            break;
        }
        Py_INCREF(sink); /* the request goes with the key */
        int done = PyDict_DelItem(row, entry);
        if (done == 0 && opcode == 1) {
            done = append_grouped(acks, sink, entry);
        } else if (done == 0) {
            done = append_grouped(reads, sink, frame); /* the whole frame: no body copied */
        }
        Py_DECREF(sink);
        Py_DECREF(entry);
        if (done < 0) goto failed;
    }
    Py_XDECREF(row);
    return Py_BuildValue("(NNn)", acks, reads, i);
failed:
    Py_XDECREF(row);
    Py_XDECREF(acks);
    Py_XDECREF(reads);
    return NULL;
}

/* A writable buffer of 8-byte integers ("Q" or "q", as ``array`` makes them): 0, or -1 with
 * the error set. The caller releases it. */
static int int64_buffer(PyObject *obj, const char *format, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, format) != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "expected an array('%s')", format);
        return -1;
    }
    return 0;
}

/* pending_ack(acked, failed, sent, base, entry_ids, index, ensemble_size, write_quorum, first)
 * -> list: a writer's pass over one bookie's durable acks (core/writer.py, ``_Pending``). The
 * arrays hold the pending adds from entry ``base`` on: ``acked`` and ``failed`` the ensemble
 * indices that acked or failed (bits, array('Q')), ``sent`` when each was sent (array('q'),
 * negative: not sent). For each id from ``first`` on that is pending and sent, and whose write
 * set holds ``index`` ((index - id) mod E < Qw), the bit of ``index`` is set in ``acked`` and
 * cleared in ``failed``; others change nothing. Ids below ``first`` (entries of earlier
 * fragments, whose bookie the caller must check) come back in a list, in order. */
static PyObject *pending_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long ints[4];
    if (nargs != 9 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "pending_ack(acked, failed, sent, base, entry_ids: list, index, "
                        "ensemble_size, write_quorum, first)");
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[3]);
    if (base == -1 && PyErr_Occurred()) return NULL;
    for (int i = 0; i < 4; i++) {
        ints[i] = PyLong_AsLongLong(args[5 + i]);
        if (ints[i] == -1 && PyErr_Occurred()) return NULL;
    }
    long long index = ints[0], size = ints[1], write_quorum = ints[2], first = ints[3];
    if (index < 0 || index > 63 || size < 1 || size > 64) {
        PyErr_SetString(PyExc_ValueError, "pending_ack: ensembles of at most 64 bookies");
        return NULL;
    }
    Py_buffer acked, failed, sent;
    if (int64_buffer(args[0], "Q", &acked) < 0) return NULL;
    if (int64_buffer(args[1], "Q", &failed) < 0) {
        PyBuffer_Release(&acked);
        return NULL;
    }
    if (int64_buffer(args[2], "q", &sent) < 0) {
        PyBuffer_Release(&acked);
        PyBuffer_Release(&failed);
        return NULL;
    }
    PyObject *earlier = PyList_New(0);
    Py_ssize_t count = sent.len / 8;
    if (acked.len / 8 < count || failed.len / 8 < count) {
        PyErr_SetString(PyExc_ValueError, "pending_ack: arrays of different lengths");
        Py_CLEAR(earlier);
    }
    uint64_t *a = (uint64_t *)acked.buf, *f = (uint64_t *)failed.buf, bit = 1ULL << index;
    int64_t *s = (int64_t *)sent.buf;
    PyObject *ids = args[4];
    for (Py_ssize_t i = 0; earlier != NULL && i < PyList_GET_SIZE(ids); i++) {
        PyObject *item = PyList_GET_ITEM(ids, i);
        long long entry_id = PyLong_AsLongLong(item);
        if (entry_id == -1 && PyErr_Occurred()) {
            Py_CLEAR(earlier);
            break;
        }
        if (entry_id < first) {
            if (PyList_Append(earlier, item) < 0) Py_CLEAR(earlier);
            continue;
        }
        long long at = entry_id - base;
        if (at < 0 || at >= count || s[at] < 0) continue;
        long long member = (index - entry_id) % size;
        if (member < 0) member += size;
        if (member >= write_quorum) continue;
        f[at] &= ~bit;
        a[at] |= bit;
    }
    PyBuffer_Release(&acked);
    PyBuffer_Release(&failed);
    PyBuffer_Release(&sent);
    return earlier;
}

/* pending_done(acked, sent, ack_quorum) -> int: how many pending adds at the head of the arrays
 * (see pending_ack) were sent and acked by at least ``ack_quorum`` bookies, in a row. */
static PyObject *pending_done(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "pending_done(acked, sent, ack_quorum)");
        return NULL;
    }
    long long quorum = PyLong_AsLongLong(args[2]);
    if (quorum == -1 && PyErr_Occurred()) return NULL;
    Py_buffer acked, sent;
    if (int64_buffer(args[0], "Q", &acked) < 0) return NULL;
    if (int64_buffer(args[1], "q", &sent) < 0) {
        PyBuffer_Release(&acked);
        return NULL;
    }
    Py_ssize_t count = sent.len / 8, done = 0;
    if (acked.len / 8 < count) count = acked.len / 8;
    const uint64_t *a = (const uint64_t *)acked.buf;
    const int64_t *s = (const int64_t *)sent.buf;
    while (done < count && s[done] >= 0 && __builtin_popcountll(a[done]) >= quorum) done++;
    PyBuffer_Release(&acked);
    PyBuffer_Release(&sent);
    return PyLong_FromSsize_t(done);
}


/* ---- JournalSyncer: a thread that fdatasyncs a journal file for the loop that writes it ----
 *
 * The bookie's loop writes a journal's groups into the page cache itself and asks for them to be
 * made durable: request(seq) says that everything written so far is covered by sequence number
 * seq. The thread syncs the file (every request that came in while one sync ran is covered by the
 * next) and then writes to an eventfd that the loop watches; take() tells the loop how far the
 * syncs got, how long each took and whether one failed. The thread never takes the GIL: a sync's
 * hand-off costs a wake-up each way and nothing else. */

#define SYNC_TIMES 64

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t work;  /* the thread waits here for a request or the stop */
    pthread_cond_t idle;  /* drain() and set_fd() wait here for the syncs in progress */
    pthread_t thread;
    int started;
    int efd;
    int fd;
    int stop;
    int busy;
    int error;                 /* errno of the first failed sync, 0 if none */
    long long requested;       /* the last sequence number asked for */
    long long synced;          /* the last one covered by a finished sync */
    double times[SYNC_TIMES];  /* how long each sync since the last take() took, seconds */
    int n_times;
    double last_end;           /* CLOCK_MONOTONIC seconds when the last sync ended */
} SyncerObject;

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *syncer_run(void *arg) {
    SyncerObject *s = (SyncerObject *)arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->requested == s->synced) pthread_cond_wait(&s->work, &s->mu);
        if (s->requested == s->synced) break; /* stopping with nothing asked for */
        long long target = s->requested;
        int fd = s->fd;
        int failed = s->error != 0;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        double start = monotonic_s();
        int rc = failed ? -1 : fdatasync(fd);
        int err = rc < 0 ? (failed ? 0 : errno) : 0;
        double end = monotonic_s();
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        if (err && !s->error) s->error = err;
        s->synced = target;
        if (s->n_times == SYNC_TIMES) { /* keep the latest: the last one decides inline syncs */
            memmove(s->times, s->times + 1, (SYNC_TIMES - 1) * sizeof(double));
            s->n_times--;
        }
        s->times[s->n_times++] = end - start;
        s->last_end = end;
        pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        ssize_t written;
        do {
            written = write(s->efd, &one, sizeof one);
        } while (written < 0 && errno == EINTR);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void syncer_stop(SyncerObject *s) {
    if (!s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(s->thread, NULL);
    Py_END_ALLOW_THREADS
    s->started = 0;
}

static PyObject *syncer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int fd;
    static char *kwlist[] = {"fd", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i:JournalSyncer", kwlist, &fd)) return NULL;
    SyncerObject *s = (SyncerObject *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->efd = -1;
    s->fd = fd;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(s);
        return NULL;
    }
    int rc = pthread_create(&s->thread, NULL, syncer_run, s);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(s);
        return NULL;
    }
    s->started = 1;
    pthread_setname_np(s->thread, "journal-sync"); /* for top -H, perf, /proc (best effort) */
    return (PyObject *)s;
}

static void syncer_dealloc(SyncerObject *s) {
    syncer_stop(s);
    if (s->efd >= 0) close(s->efd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *syncer_closed_error(void) {
    PyErr_SetString(PyExc_ValueError, "the journal syncer is closed");
    return NULL;
}

static PyObject *syncer_request(SyncerObject *s, PyObject *arg) {
    long long seq = PyLong_AsLongLong(arg);
    if (seq == -1 && PyErr_Occurred()) return NULL;
    if (!s->started) return syncer_closed_error();
    pthread_mutex_lock(&s->mu);
    if (seq <= s->requested) {
        pthread_mutex_unlock(&s->mu);
        PyErr_SetString(PyExc_ValueError, "sync requests must have increasing numbers");
        return NULL;
    }
    s->requested = seq;
    if (!s->busy) pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    Py_RETURN_NONE;
}

static PyObject *syncer_take(SyncerObject *s, PyObject *Py_UNUSED(ignored)) {
    uint64_t count;
    if (read(s->efd, &count, sizeof count) < 0 && errno != EAGAIN) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    double times[SYNC_TIMES];
    pthread_mutex_lock(&s->mu);
    long long synced = s->synced;
    int error = s->error, n = s->n_times;
    double last_end = s->last_end;
    memcpy(times, s->times, (size_t)n * sizeof(double));
    s->n_times = 0;
    pthread_mutex_unlock(&s->mu);
    PyObject *durations = PyTuple_New(n);
    if (durations == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *value = PyFloat_FromDouble(times[i]);
        if (value == NULL) {
            Py_DECREF(durations);
            return NULL;
        }
        PyTuple_SET_ITEM(durations, i, value);
    }
    return Py_BuildValue("LiNd", synced, error, durations, last_end);
}

/* Waits (the GIL released, and taken back only once the mutex is let go: a thread holding the
 * GIL may be waiting for the mutex) until no sync runs or is asked for; then, if fd >= 0, the
 * syncer syncs that file from now on. */
static void syncer_wait_idle(SyncerObject *s, int fd) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&s->mu);
    while (s->busy || s->requested != s->synced) pthread_cond_wait(&s->idle, &s->mu);
    if (fd >= 0) s->fd = fd;
    pthread_mutex_unlock(&s->mu);
    Py_END_ALLOW_THREADS
}

static PyObject *syncer_drain(SyncerObject *s, PyObject *Py_UNUSED(ignored)) {
    if (!s->started) return syncer_closed_error();
    syncer_wait_idle(s, -1);
    Py_RETURN_NONE;
}

static PyObject *syncer_set_fd(SyncerObject *s, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "a file descriptor is not negative");
        return NULL;
    }
    if (!s->started) return syncer_closed_error();
    syncer_wait_idle(s, fd);
    Py_RETURN_NONE;
}

static PyObject *syncer_close(SyncerObject *s, PyObject *Py_UNUSED(ignored)) {
    syncer_stop(s);
    if (s->efd >= 0) close(s->efd);
    s->efd = -1;
    Py_RETURN_NONE;
}

static PyObject *syncer_eventfd(SyncerObject *s, void *Py_UNUSED(closure)) {
    return PyLong_FromLong(s->efd);
}

static PyObject *syncer_idle(SyncerObject *s, void *Py_UNUSED(closure)) {
    pthread_mutex_lock(&s->mu);
    int idle = !s->busy && s->requested == s->synced;
    pthread_mutex_unlock(&s->mu);
    return PyBool_FromLong(idle);
}

static PyMethodDef syncer_methods[] = {
    {"request", (PyCFunction)syncer_request, METH_O,
     "Asks for a sync covering everything written so far, numbered seq (increasing)."},
    {"take", (PyCFunction)syncer_take, METH_NOARGS,
     "(last seq synced, errno of a failed sync or 0, each sync's seconds since the last take, "
     "monotonic end of the last sync); clears the eventfd."},
    {"drain", (PyCFunction)syncer_drain, METH_NOARGS,
     "Waits (without the GIL) until every sync asked for has run."},
    {"set_fd", (PyCFunction)syncer_set_fd, METH_O,
     "Waits until every sync asked for has run, then syncs this file from now on."},
    {"close", (PyCFunction)syncer_close, METH_NOARGS,
     "Runs the syncs asked for, stops the thread and closes the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef syncer_getset[] = {
    {"eventfd", (getter)syncer_eventfd, NULL, "readable once a sync has finished", NULL},
    {"idle", (getter)syncer_idle, NULL, "no sync runs or is asked for", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bookkeeper_py._speedups.JournalSyncer",
    .tp_basicsize = sizeof(SyncerObject),
    .tp_dealloc = (destructor)syncer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A thread that fdatasyncs a journal file on request and signals an eventfd.",
    .tp_methods = syncer_methods,
    .tp_getset = syncer_getset,
    .tp_new = syncer_new,
};

/* A latency histogram (prometheus.py's _Buckets): counts per bucket of upper bounds, and the sum
 * of the latencies. A bookie records several per journal group (its adds, the group's wait and
 * sync); these are its methods as C calls, without a Python frame each. Updated from one thread
 * (under the GIL), read at scrape time. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n;      /* bounds; counts has n + 1 (the last: above every bound) */
    double *bounds;    /* increasing */
    long long *counts;
    double total;
} BucketsObject;

static PyObject *buckets_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *bounds;
    static char *kwlist[] = {"bounds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:LatencyBuckets", kwlist, &PyTuple_Type,
                                     &bounds))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(bounds);
    BucketsObject *b = (BucketsObject *)type->tp_alloc(type, 0);
    if (b == NULL) return NULL;
    b->bounds = PyMem_Calloc((size_t)(n ? n : 1), sizeof(double));
    b->counts = PyMem_Calloc((size_t)n + 1, sizeof(long long));
    if (b->bounds == NULL || b->counts == NULL) {
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    b->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        b->bounds[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (b->bounds[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(b);
            return NULL;
        }
        if (i > 0 && !(b->bounds[i] > b->bounds[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "LatencyBuckets: the bounds must increase");
            Py_DECREF(b);
            return NULL;
        }
    }
    return (PyObject *)b;
}

static void buckets_dealloc(BucketsObject *b) {
    PyMem_Free(b->bounds);
    PyMem_Free(b->counts);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

/* bisect_left: the first bucket whose bound is >= seconds (n: above them all; NaN: 0, as there). */
static Py_ssize_t buckets_index(const BucketsObject *b, double seconds) {
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (b->bounds[mid] < seconds) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static PyObject *buckets_observe(BucketsObject *b, PyObject *arg) {
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred()) return NULL;
    b->counts[buckets_index(b, seconds)] += 1;
    b->total += seconds;
    Py_RETURN_NONE;
}

static PyObject *buckets_observe_many(BucketsObject *b, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "observe_many(seconds, count)");
        return NULL;
    }
    double seconds = PyFloat_AsDouble(args[0]);
    if (seconds == -1.0 && PyErr_Occurred()) return NULL;
    long long count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    b->counts[buckets_index(b, seconds)] += count;
    b->total += seconds * (double)count;
    Py_RETURN_NONE;
}

static PyObject *buckets_counts(BucketsObject *b, void *Py_UNUSED(closure)) {
    PyObject *out = PyList_New(b->n + 1);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i <= b->n; i++) {
        PyObject *count = PyLong_FromLongLong(b->counts[i]);
        if (count == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, count);
    }
    return out;
}

static PyObject *buckets_total(BucketsObject *b, void *Py_UNUSED(closure)) {
    return PyFloat_FromDouble(b->total);
}

static PyMethodDef buckets_methods[] = {
    {"observe", (PyCFunction)buckets_observe, METH_O, "Counts one latency, in seconds."},
    {"observe_many", (PyCFunction)(void (*)(void))buckets_observe_many, METH_FASTCALL,
     "Counts count latencies of the same seconds."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buckets_getset[] = {
    {"counts", (getter)buckets_counts, NULL,
     "the count per bucket (a list; the last: above every bound)", NULL},
    {"total", (getter)buckets_total, NULL, "the sum of the latencies counted, in seconds", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BucketsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bookkeeper_py._speedups.LatencyBuckets",
    .tp_basicsize = sizeof(BucketsObject),
    .tp_dealloc = (destructor)buckets_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A latency histogram: counts per bucket of increasing upper bounds, and the sum.",
    .tp_methods = buckets_methods,
    .tp_getset = buckets_getset,
    .tp_new = buckets_new,
};

/* A bookie's batch of adds into its write cache (storage/ledger_storage.py's _LedgerEntries
 * .add_new and the bytes it adds): chunks maps entry id >> bits to a dict entry id -> entry.
 * Only when the ids increase and none is held yet: every entry is put in its chunk (a chunk
 * made where there is none) and the sum of their lengths returned. Otherwise nothing changes:
 * -1 when an id is held already, -2 when the ids do not increase or an entry is not bytes (the
 * Python path then handles the batch). */
static PyObject *cache_add_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyList_Check(args[2]) || PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "cache_add_new(chunks: dict, entry_ids: list, entries: list of the same "
                        "length, chunk_bits: int)");
        return NULL;
    }
    PyObject *chunks = args[0], *ids = args[1], *entries = args[2];
    long bits = PyLong_AsLong(args[3]);
    if (bits == -1 && PyErr_Occurred()) return NULL;
    if (bits < 0 || bits > 62) {
        PyErr_SetString(PyExc_ValueError, "cache_add_new: chunk_bits out of range");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    long long previous = LLONG_MIN, size = 0;
    /* First pass: the ids increase, the entries are bytes, and no id is held (each chunk
     * looked up once per run of ids in it). */
    PyObject *chunk = NULL;
    long long chunk_key = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(ids, i), *entry = PyList_GET_ITEM(entries, i);
        if (!PyLong_CheckExact(id) || !PyBytes_CheckExact(entry)) return PyLong_FromLong(-2);
        long long entry_id = PyLong_AsLongLong(id);
        if (entry_id == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyLong_FromLong(-2);
        }
        if (i > 0 && entry_id <= previous) return PyLong_FromLong(-2);
        previous = entry_id;
        size += PyBytes_GET_SIZE(entry);
        long long key = entry_id >> bits;
        if (i == 0 || key != chunk_key) {
            chunk_key = key;
            PyObject *key_object = PyLong_FromLongLong(key);
            if (key_object == NULL) return NULL;
            chunk = PyDict_GetItemWithError(chunks, key_object); /* borrowed */
            Py_DECREF(key_object);
            if (chunk == NULL && PyErr_Occurred()) return NULL;
            if (chunk != NULL && !PyDict_CheckExact(chunk)) return PyLong_FromLong(-2);
        }
        if (chunk != NULL) {
            int held = PyDict_Contains(chunk, id);
            if (held < 0) return NULL;
            if (held) return PyLong_FromLong(-1);
        }
    }
    /* Second pass: put them. */
    chunk = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        long long key = PyLong_AsLongLong(id) >> bits;
        if (chunk == NULL || key != chunk_key) {
            chunk_key = key;
            PyObject *key_object = PyLong_FromLongLong(key);
            if (key_object == NULL) return NULL;
            chunk = PyDict_GetItemWithError(chunks, key_object);
            if (chunk == NULL) {
                if (PyErr_Occurred() || (chunk = PyDict_New()) == NULL) {
                    Py_DECREF(key_object);
                    return NULL;
                }
                int failed = PyDict_SetItem(chunks, key_object, chunk);
                Py_DECREF(chunk); /* the chunks dict holds it */
                if (failed < 0) {
                    Py_DECREF(key_object);
                    return NULL;
                }
            }
            Py_DECREF(key_object);
        }
        if (PyDict_SetItem(chunk, id, PyList_GET_ITEM(entries, i)) < 0) return NULL;
    }
    return PyLong_FromLongLong(size);
}

static PyMethodDef methods[] = {
    {"pending_ack", (PyCFunction)(void (*)(void))pending_ack, METH_FASTCALL,
     "A writer's pass over one bookie's durable acks of pending adds."},
    {"pending_done", (PyCFunction)(void (*)(void))pending_done, METH_FASTCALL,
     "How many pending adds at the head are sent and acked by a quorum."},
    {"v2_take_answers", (PyCFunction)(void (*)(void))v2_take_answers, METH_FASTCALL,
     "A client's run of v2 add acks and read answers: their requests taken, grouped by sink."},
    {"take_plain_reads", (PyCFunction)(void (*)(void))take_plain_reads, METH_FASTCALL,
     "A bookie's run of plain v2 reads taken off its backlog, grouped by ledger."},
    {"v2_answers", (PyCFunction)(void (*)(void))v2_answers, METH_FASTCALL,
     "The framed answers to plain v2 reads or adds of one ledger, in one bytes."},
    {"v2_batch_answer", (PyCFunction)(void (*)(void))v2_batch_answer, METH_FASTCALL,
     "A framed BATCH_READ_ENTRY answer: the fixed part, then each entry with its length."},
    {"take_plain_adds", (PyCFunction)(void (*)(void))take_plain_adds, METH_FASTCALL,
     "A bookie's run of plain v2 adds taken off its backlog, grouped by ledger and key."},
    {"cut_plain_adds", (PyCFunction)(void (*)(void))cut_plain_adds, METH_FASTCALL,
     "A bookie's run of plain v2 adds cut out of the bytes it received, grouped likewise."},
    {"cache_add_new", (PyCFunction)(void (*)(void))cache_add_new, METH_FASTCALL,
     "A batch of increasing, new entry ids put in a write cache's chunks; their bytes."},
    {"journal_group", (PyCFunction)(void (*)(void))journal_group, METH_FASTCALL,
     "A journal group's pieces to write, and its records' tokens."},
    {"group_adds", (PyCFunction)(void (*)(void))group_adds, METH_FASTCALL,
     "A v2 writer's sends of one pass grouped by bookie: ids and request chunks."},
    {"complete_adds", (PyCFunction)(void (*)(void))complete_adds, METH_FASTCALL,
     "A writer's acknowledged adds: entries dropped, futures given their ids, callbacks listed."},
    {"split_frames", (PyCFunction)(void (*)(void))split_frames, METH_FASTCALL,
     "The whole length-prefixed frames of bytes from a position, and where the rest begins."},
    {"entry_log_record", (PyCFunction)(void (*)(void))entry_log_record, METH_FASTCALL,
     "The entry of a whole, checked entry-log record in a block, else None."},
    {"entry_log_frame", (PyCFunction)(void (*)(void))entry_log_frame, METH_FASTCALL,
     "A batch of entry-log records framed back to back into a bytearray; their locations."},
    {"index_pairs", (PyCFunction)(void (*)(void))index_pairs, METH_FASTCALL,
     "A checkpoint's slice of entry locations as LMDB (key, value) items."},
    {"entry_log_pick", (PyCFunction)(void (*)(void))entry_log_pick, METH_FASTCALL,
     "The wanted entries of a ledger's records in an entry-log block, and where it stopped."},
    {"v2_register", (PyCFunction)(void (*)(void))v2_register, METH_FASTCALL,
     "a batch of v2 requests into a connection's pending ones; returns the ids pending already"},
    {"v2_register_reads", (PyCFunction)(void (*)(void))v2_register_reads, METH_FASTCALL,
     "A connection's batch of plain v2 reads: registered as pending, framed in one bytes."},
    {"stripe_answers", (PyCFunction)(void (*)(void))stripe_answers, METH_FASTCALL,
     "A client's pass over one bookie's answers to a striped read of a CRC32C ledger."},
    {"crc32c_batch_entries", (PyCFunction)(void (*)(void))crc32c_batch_entries, METH_FASTCALL,
     "The entries of a batch read answer's CRC32C records, all checked; None otherwise."},
    {"crc32c_payload", (PyCFunction)(void (*)(void))crc32c_payload, METH_FASTCALL,
     "The payload of a CRC32C entry whose digest and ids check out, else None."},
    {"crc32c_package", (PyCFunction)(void (*)(void))crc32c_package, METH_FASTCALL,
     "A CRC32C entry: header, digest, payload."},
    {"crc32c_package_run", (PyCFunction)(void (*)(void))crc32c_package_run, METH_FASTCALL,
     "crc32c_package_run(ledger_id, first_entry_id, lac, lengths, payloads) -> list of entries"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "Per-entry CRC32C work in C (see speedups.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("sse4.2")) {
        PyErr_SetString(PyExc_ImportError, "this CPU has no SSE 4.2 (CRC32C instructions)");
        return NULL;
    }
    make_shifts();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &SyncerType) < 0 || PyModule_AddType(m, &BucketsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
