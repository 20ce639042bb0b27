/* _frscan.index_contiguous: one rank's per-group index (records/group_index.py, `index_groups`) in one C pass over
 * its columns, for the common shape: in every group the collectives carry consecutive sequence numbers, one entry
 * each. The reference is group_index.index_groups' Python loop; this returns exactly its results (members, p2p
 * positions, signature codes in order of first appearance over the groups, first / next seq), or None for any other
 * shape (a gap, a repeated or out-of-order seq, coalesced ops sharing one), and the Python loop does the work.
 *
 * It reads only the columns the scanner or fastcols built (ints and small codes, already checked); every code is
 * bounds-checked against the tables' sizes it is given, and memory is O(entries).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct { Py_buffer view; Py_ssize_t n; } Col;

static int col_open(PyObject *obj, Col *c, Py_ssize_t n_expected) {
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t size = c->view.itemsize;
    if (size != 1 && size != 2 && size != 4 && size != 8) {
        PyBuffer_Release(&c->view);
        PyErr_SetString(PyExc_ValueError, "column item size");
        return -1;
    }
    c->n = c->view.len / size;
    if (n_expected >= 0 && c->n != n_expected) {
        PyBuffer_Release(&c->view);
        PyErr_SetString(PyExc_ValueError, "column length");
        return -1;
    }
    return 0;
}

/* Unsigned codes (B, H, I, or q for seq: read as int64 by col_i64). */
static inline uint64_t col_u(const Col *c, Py_ssize_t i) {
    const char *p = (const char *)c->view.buf;
    switch (c->view.itemsize) {
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const uint16_t *)p)[i];
    case 4: return ((const uint32_t *)p)[i];
    default: return ((const uint64_t *)p)[i];
    }
}

/* Signed (seq: 'b', 'h', 'i' or 'q', as EntryTable.compact narrows it). */
static inline int64_t col_i64(const Col *c, Py_ssize_t i) {
    const char *p = (const char *)c->view.buf;
    switch (c->view.itemsize) {
    case 1: return ((const int8_t *)p)[i];
    case 2: return ((const int16_t *)p)[i];
    case 4: return ((const int32_t *)p)[i];
    default: return ((const int64_t *)p)[i];
    }
}

/* Open addressing: signature key -> code, in order of first appearance. */
typedef struct { int64_t *keys; uint32_t *codes; Py_ssize_t cap, count; } KeyMap;

static int64_t keymap_code(KeyMap *m, int64_t key) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    Py_ssize_t j = (Py_ssize_t)(h >> 32) & (m->cap - 1);
    while (m->codes[j]) {
        if (m->keys[j] == key) return m->codes[j] - 1;
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = key;
    m->codes[j] = (uint32_t)(++m->count);
    return m->count - 1;
}

static PyObject *bytes_u32(const uint32_t *p, Py_ssize_t n) {
    return PyBytes_FromStringAndSize((const char *)p, n * 4);
}

PyObject *frscan_index_contiguous(PyObject *self, PyObject *args) {
    PyObject *gid_o, *flags_o, *state_o, *seq_o, *name_o, *shape_o, *done_o, *op_of_name_o;
    Py_ssize_t ngroups, shape_count;
    if (!PyArg_ParseTuple(args, "OnOOOOOOOn", &gid_o, &ngroups, &flags_o, &state_o, &done_o, &seq_o, &name_o,
                          &op_of_name_o, &shape_o, &shape_count))
        return NULL;
    Col gid, flags, state, seq, name, shape;
    Py_buffer done;
    int opened = 0;
    PyObject *result = NULL, *groups = NULL, *keys = NULL;
    int64_t *ops = NULL, *first = NULL, *last = NULL, *next_open = NULL;
    Py_ssize_t *coll_n = NULL, *p2p_n = NULL;
    uint32_t *members = NULL, *p2p = NULL, *sig = NULL;
    Py_ssize_t *coll_at = NULL, *p2p_at = NULL;
    uint8_t *has_open = NULL;
    KeyMap km = {0};
    if (col_open(gid_o, &gid, -1) < 0) return NULL;
    opened = 1;
    Py_ssize_t n = gid.n;
    if (col_open(flags_o, &flags, n) < 0) goto out;
    opened = 2;
    if (col_open(state_o, &state, n) < 0) goto out;
    opened = 3;
    if (col_open(seq_o, &seq, n) < 0) goto out;
    opened = 4;
    if (col_open(name_o, &name, n) < 0) goto out;
    opened = 5;
    if (col_open(shape_o, &shape, n) < 0) goto out;
    opened = 6;
    if (PyObject_GetBuffer(done_o, &done, PyBUF_SIMPLE) < 0) goto out;
    opened = 7;
    if (flags.view.itemsize != 1 || ngroups <= 0 || shape_count <= 0 ||
        !PyList_Check(op_of_name_o)) {
        PyErr_SetString(PyExc_ValueError, "columns");
        goto out;
    }
    Py_ssize_t nnames = PyList_GET_SIZE(op_of_name_o);
    if (!(ops = PyMem_Calloc((size_t)(nnames ? nnames : 1), sizeof(int64_t)))) goto nomem;
    for (Py_ssize_t i = 0; i < nnames; i++) {
        ops[i] = PyLong_AsLongLong(PyList_GET_ITEM(op_of_name_o, i));
        if (ops[i] == -1 && PyErr_Occurred()) goto out;
        if (ops[i] < 0 || ops[i] > (int64_t)1 << 31) goto decline;
    }
    if (shape_count > (Py_ssize_t)1 << 31) goto decline;
    size_t g = (size_t)ngroups;
    if (!(first = PyMem_Calloc(g, 8)) || !(last = PyMem_Calloc(g, 8)) || !(next_open = PyMem_Calloc(g, 8)) ||
        !(coll_n = PyMem_Calloc(g, sizeof(Py_ssize_t))) || !(p2p_n = PyMem_Calloc(g, sizeof(Py_ssize_t))) ||
        !(coll_at = PyMem_Calloc(g + 1, sizeof(Py_ssize_t))) || !(p2p_at = PyMem_Calloc(g + 1, sizeof(Py_ssize_t))) ||
        !(has_open = PyMem_Calloc(g, 1)))
        goto nomem;
    /* Pass 1: per group, count collectives and p2p ops, check that the seqs run by one, find the first open. */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t gi = col_u(&gid, i);
        uint8_t f = ((const uint8_t *)flags.view.buf)[i];
        uint64_t st = col_u(&state, i);
        if (gi >= g || st >= (uint64_t)done.len || col_u(&name, i) >= (uint64_t)nnames ||
            col_u(&shape, i) >= (uint64_t)shape_count)
            goto decline;
        if (f & 1) { p2p_n[gi]++; continue; }
        int64_t s = col_i64(&seq, i);
        if (coll_n[gi] == 0) first[gi] = s;
        else if (last[gi] == INT64_MAX || s != last[gi] + 1) goto decline;
        last[gi] = s;
        coll_n[gi]++;
        int is_open = !(((const uint8_t *)done.buf)[st] || f >= 4);
        if (is_open && !has_open[gi]) { has_open[gi] = 1; next_open[gi] = s; } /* seqs rise: the first is the least */
    }
    for (size_t k = 0; k < g; k++) {
        if (coll_n[k] && last[k] == INT64_MAX && !has_open[k]) goto decline; /* last + 1 is past int64 */
        coll_at[k + 1] = coll_at[k] + coll_n[k];
        p2p_at[k + 1] = p2p_at[k] + p2p_n[k];
    }
    if (!(members = PyMem_Malloc((size_t)(n ? n : 1) * 4)) || !(p2p = PyMem_Malloc((size_t)(n ? n : 1) * 4)) ||
        !(sig = PyMem_Malloc((size_t)(n ? n : 1) * 4)))
        goto nomem;
    /* Pass 2: positions per group, in order. */
    {
        Py_ssize_t *cfill = PyMem_Calloc(g, sizeof(Py_ssize_t)), *pfill = PyMem_Calloc(g, sizeof(Py_ssize_t));
        if (!cfill || !pfill) { PyMem_Free(cfill); PyMem_Free(pfill); goto nomem; }
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t gi = col_u(&gid, i);
            if (((const uint8_t *)flags.view.buf)[i] & 1) p2p[p2p_at[gi] + pfill[gi]++] = (uint32_t)i;
            else members[coll_at[gi] + cfill[gi]++] = (uint32_t)i;
        }
        PyMem_Free(cfill);
        PyMem_Free(pfill);
    }
    /* Pass 3: signature codes, numbered in order of first appearance over the groups in order. */
    km.cap = 64;
    while (km.cap < 2 * (n + 1)) km.cap *= 2;
    if (!(km.keys = PyMem_Calloc((size_t)km.cap, 8)) || !(km.codes = PyMem_Calloc((size_t)km.cap, 4))) goto nomem;
    if (!(keys = PyList_New(0))) goto out;
    for (Py_ssize_t j = 0; j < coll_at[g]; j++) {
        Py_ssize_t p = members[j];
        int64_t key = ops[col_u(&name, p)] * (int64_t)shape_count + (int64_t)col_u(&shape, p);
        Py_ssize_t before = km.count;
        int64_t code = keymap_code(&km, key);
        if (km.count != before) {
            PyObject *k = PyLong_FromLongLong(key);
            if (!k || PyList_Append(keys, k)) { Py_XDECREF(k); goto out; }
            Py_DECREF(k);
        }
        sig[j] = (uint32_t)code;
    }
    if (!(groups = PyList_New((Py_ssize_t)g))) goto out;
    for (size_t k = 0; k < g; k++) {
        Py_ssize_t c0 = coll_at[k], c = coll_n[k], p0 = p2p_at[k];
        int64_t next = !c ? 1 : has_open[k] ? next_open[k] : last[k] + 1;
        PyObject *item = Py_BuildValue("(NNLnLN)", bytes_u32(members + c0, c), bytes_u32(p2p + p0, p2p_n[k]),
                                       (long long)(c ? first[k] : 0), c, (long long)next, bytes_u32(sig + c0, c));
        if (!item) goto out;
        PyList_SET_ITEM(groups, (Py_ssize_t)k, item);
    }
    result = PyTuple_Pack(2, groups, keys);
    goto out;
nomem:
    PyErr_NoMemory();
    goto out;
decline:
    result = Py_None;
    Py_INCREF(result);
out:
    Py_XDECREF(groups);
    Py_XDECREF(keys);
    PyMem_Free(ops); PyMem_Free(first); PyMem_Free(last); PyMem_Free(next_open); PyMem_Free(coll_n);
    PyMem_Free(p2p_n); PyMem_Free(coll_at); PyMem_Free(p2p_at); PyMem_Free(has_open); PyMem_Free(members);
    PyMem_Free(p2p); PyMem_Free(sig); PyMem_Free(km.keys); PyMem_Free(km.codes);
    if (opened >= 7) PyBuffer_Release(&done);
    if (opened >= 6) PyBuffer_Release(&shape.view);
    if (opened >= 5) PyBuffer_Release(&name.view);
    if (opened >= 4) PyBuffer_Release(&seq.view);
    if (opened >= 3) PyBuffer_Release(&state.view);
    if (opened >= 2) PyBuffer_Release(&flags.view);
    if (opened >= 1) PyBuffer_Release(&gid.view);
    return result;
}

/* _frscan.narrow(column, signed) -> (typecode, bytes): an array's ints in the smallest array type that holds them
 * all ('b'/'h'/'i'/'q' signed, 'B'/'H'/'I'/'Q' unsigned), one C pass (EntryTable.compact). Any integer buffer. */
PyObject *frscan_narrow(PyObject *self, PyObject *args) {
    PyObject *obj;
    int is_signed;
    if (!PyArg_ParseTuple(args, "Op", &obj, &is_signed)) return NULL;
    Col c;
    if (col_open(obj, &c, -1) < 0) return NULL;
    const char *fmt = c.view.format ? c.view.format : "B";
    int src_signed = strchr("bhilq", fmt[0]) != NULL;
    int64_t lo = 0, hi = 0;
    uint64_t uhi = 0;
    for (Py_ssize_t i = 0; i < c.n; i++) {
        if (src_signed) {
            int64_t x = col_i64(&c, i);
            if (i == 0 || x < lo) lo = x;
            if (i == 0 || x > hi) hi = x;
        } else {
            uint64_t x = col_u(&c, i);
            if (x > uhi) uhi = x;
        }
    }
    int width;
    char code;
    if (is_signed) {
        if (!src_signed) { if (uhi > (uint64_t)INT64_MAX) { PyBuffer_Release(&c.view); Py_RETURN_NONE; } lo = 0; hi = (int64_t)uhi; }
        width = (lo >= -128 && hi < 128) ? 1 : (lo >= -32768 && hi < 32768) ? 2 : (lo >= INT32_MIN && hi <= INT32_MAX) ? 4 : 8;
        code = width == 1 ? 'b' : width == 2 ? 'h' : width == 4 ? 'i' : 'q';
    } else {
        if (src_signed) { if (lo < 0) { PyBuffer_Release(&c.view); Py_RETURN_NONE; } uhi = (uint64_t)hi; }
        width = uhi < 256 ? 1 : uhi < 65536 ? 2 : uhi <= UINT32_MAX ? 4 : 8;
        code = width == 1 ? 'B' : width == 2 ? 'H' : width == 4 ? 'I' : 'Q';
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, c.n * width);
    if (!out) { PyBuffer_Release(&c.view); return NULL; }
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < c.n; i++) {
        int64_t x = src_signed ? col_i64(&c, i) : (int64_t)col_u(&c, i);
        switch (width) {
        case 1: { int8_t v = (int8_t)x; memcpy(p + i, &v, 1); break; }
        case 2: { int16_t v = (int16_t)x; memcpy(p + 2 * i, &v, 2); break; }
        case 4: { int32_t v = (int32_t)x; memcpy(p + 4 * i, &v, 4); break; }
        default: memcpy(p + 8 * i, &x, 8);
        }
    }
    PyBuffer_Release(&c.view);
    return Py_BuildValue("(CN)", code, out);
}
