/* The scanner's arena (records/_frscan.c): tagged values, container nodes and their chunks, the budgeted
 * growth of every buffer. Shared by the two front-ends that fill it: the pickle opcode walk (_frscan.c) and
 * the JSON parser (_frscan_json.c); both hand the same arena to one `extract`. */
#ifndef FRSCAN_ARENA_H
#define FRSCAN_ARENA_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { K_UNSET = 0, K_NONE, K_TRUE, K_FALSE, K_INT, K_FLOAT, K_STR, K_LIST, K_TUPLE, K_DICT };

typedef struct { uint32_t kind; uint32_t len; int64_t v; } Val; /* STR: v offset, len bytes; containers: v node */
typedef struct { int64_t start, count, next; } Chunk;
typedef struct { int64_t first, last, count; uint32_t kind; } Node;

#define MAX_DEPTH 32

typedef struct {
    const uint8_t *d;
    Py_ssize_t n;
    size_t used, budget;
    int64_t work;
    /* The entries' and frames' dict items (keys and values) `extract` may still look at. A key and its value
     * cost the input at least 3 bytes (pickle: a memo GET and a 1-byte value; JSON: `"":0,`), so dicts read
     * once stay within the input's length; a pickle's memo can list one dict of many keys as every entry or
     * frame (2 bytes each), which would cost entries x keys: past the input's length (+ a floor) it declines. */
    int64_t keys_left;
    Val *stack; Py_ssize_t sp, scap;
    Py_ssize_t *marks; Py_ssize_t nm, mcap;
    Val *memo; Py_ssize_t memo_cap, memo_count;
    Val *vals; Py_ssize_t nv, vcap;
    Chunk *chunks; Py_ssize_t nc, ccap;
    Node *nodes; Py_ssize_t nn, ncap;
    PyObject **node_obj; Py_ssize_t ocap; /* materialized containers, per node (shared as the pickle shares them) */
    Py_ssize_t memo_hi; /* memo slots [0, memo_hi) may be set */
    Val result;
    /* JSON only: `d` is `pool`, a copy of the input in which escaped strings are decoded in place (a decoded
     * string is never longer than its escaped form), made at the first escape; until then `d` is the input. */
    uint8_t *pool; Py_ssize_t pool_cap;
    /* JSON only: (node, start, end) of every container opened at depth <= span_depth (1: the top level), in
     * node order; end -1 until it is closed. */
    int64_t *spans; Py_ssize_t nspans, spans_cap;
    int span_depth;
    int prefix; Py_ssize_t end; /* JSON: `prefix`: the text may go on after the value, which ends at `end` */
} Scan;

/* The JSON front-end (_frscan_json.c): s->d / s->n the text; 0 and s->result, or -1: decline. */
int frscan_parse_json(Scan *s);

/* _frscan.c: a scan's arena over `view` (the buffers kept between scans when free: returns whether it took
 * them) and its release; the table of the dict s->result (None-or-NULL: declined; `pieces`: a snapshot piece's
 * entries are its trace's; `last` > 0: only the newest `last` entries). */
int frscan_begin(Scan *s, const Py_buffer *view, Py_ssize_t budget);
void frscan_end(Scan *s, int taken);
PyObject *frscan_extract(Scan *s, int pieces, Py_ssize_t last);

#define EACH_CHILD(s, node, val, ...) do { \
    for (int64_t _c = (s)->nodes[node].first; _c >= 0; _c = (s)->chunks[_c].next) { \
        for (int64_t _i = 0; _i < (s)->chunks[_c].count; _i++) { \
            Val *val = &(s)->vals[(s)->chunks[_c].start + _i]; \
            __VA_ARGS__ \
        } \
    } } while (0)

static inline int is_key(const Scan *s, const Val *key, const char *name, uint32_t len) {
    return key->kind == K_STR && key->len == len && !memcmp(s->d + key->v, name, len);
}

static int grow(Scan *s, void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elem) {
    if (need <= *cap) return 0;
    Py_ssize_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > PY_SSIZE_T_MAX / 4) return -1;
        nc *= 2;
    }
    size_t add = (size_t)(nc - *cap) * elem;
    if ((size_t)nc > SIZE_MAX / elem || s->used + add > s->budget) return -1;
    void *q = PyMem_Realloc(*p, (size_t)nc * elem);
    if (!q) return -1;
    *p = q;
    s->used += add;
    *cap = nc;
    return 0;
}

#define GROW(s, arr, cap, need) grow((s), (void **)&(arr), &(cap), (need), sizeof(*(arr)))

static inline int push(Scan *s, Val v) {
    if (__builtin_expect(s->sp >= s->scap, 0) && GROW(s, s->stack, s->scap, s->sp + 1)) return -1;
    s->stack[s->sp++] = v;
    return 0;
}

static inline int new_node(Scan *s, uint32_t kind, Val *out) {
    if (__builtin_expect(s->nn >= s->ncap, 0) && GROW(s, s->nodes, s->ncap, s->nn + 1)) return -1;
    s->nodes[s->nn] = (Node){-1, -1, 0, kind};
    *out = (Val){kind, 0, s->nn};
    s->nn++;
    return 0;
}

/* Append `count` values from `src` to node `node` as one chunk (src is the stack: never the vals pool). */
static inline int add_chunk(Scan *s, int64_t node, const Val *src, Py_ssize_t count) {
    if (count == 0) return 0;
    if ((s->nv + count > s->vcap && GROW(s, s->vals, s->vcap, s->nv + count)) ||
        (s->nc + 1 > s->ccap && GROW(s, s->chunks, s->ccap, s->nc + 1)))
        return -1;
    Val *dst = s->vals + s->nv;
    if (count <= 4) for (Py_ssize_t i = 0; i < count; i++) dst[i] = src[i];
    else memcpy(dst, src, (size_t)count * sizeof(Val));
    Node *nd = &s->nodes[node];
    if (nd->last >= 0 && nd->last == s->nc - 1) {
        Chunk *prev = &s->chunks[nd->last];
        if (prev->start + prev->count == s->nv) { /* this node's chunk ends the pool: extend it */
            prev->count += count;
            nd->count += count;
            s->nv += count;
            return 0;
        }
    }
    s->chunks[s->nc] = (Chunk){s->nv, count, -1};
    if (nd->last >= 0) s->chunks[nd->last].next = s->nc; else nd->first = s->nc;
    nd->last = s->nc;
    nd->count += count;
    s->nv += count;
    s->nc++;
    return 0;
}

#endif
