/* _frscan: read one Flight Recorder pickle straight into compact columns, without a Python dict per entry.
 *
 * The reference is frscope.records.safe_pickle (the allow-list unpickler) followed by fastcols.table_from_entries;
 * this module is only a faster way to the same table, and only for the regular shape. It walks the pickle's
 * opcode stream (protocols 2-5, the opcodes torch's and Python's picklers write for plain containers) into an
 * arena of tagged C values (no Python object per value), then reads the top-level dict's "entries" list entry by
 * entry: ints and floats go into int64/double buffers, everything else (groups, op names, states, timeouts,
 * threads, shapes, stacks) is interned by content into small tables whose distinct values alone become Python
 * objects. Python (frscope.records.scan) then checks those distinct values with the field table's rules (records/fields.py).
 *
 * Safety: it never imports, calls or builds anything but None, bool, int, float, str, list, tuple and dict.
 * GLOBAL, REDUCE, BUILD, persistent ids and every other opcode outside the list below make it decline, as do: a
 * truncated or malformed stream, a non-str dict key, an int outside int64, invalid UTF-8, memo indexes past the
 * input's length, nesting deeper than a small fixed depth, work past a budget proportional to the input (shared
 * references cannot blow up), and memory past the caller's budget. Every read is bounds-checked, nothing
 * recurses deeper than MAX_DEPTH. Declining returns None: the caller reads the file the reference way, which
 * reports whatever is wrong with it. So this module never decides what a bad file means.
 */
#include "_frscan_arena.h"


/* The arena's buffers are kept between scans (a worker scans thousands of files of one size): fresh ones cost
 * more in page faults than the scan itself. Kept only while small; `kept_busy` guards against reentrance. */
#define KEEP_MAX_BYTES (96u << 20)
static Scan kept;
static int kept_busy;

static void scan_take(Scan *s) {
    if (kept_busy) return;
    kept_busy = 1;
    s->stack = kept.stack; s->scap = kept.scap;
    s->marks = kept.marks; s->mcap = kept.mcap;
    s->memo = kept.memo; s->memo_cap = kept.memo_cap;
    s->vals = kept.vals; s->vcap = kept.vcap;
    s->chunks = kept.chunks; s->ccap = kept.ccap;
    s->nodes = kept.nodes; s->ncap = kept.ncap;
    s->node_obj = kept.node_obj; s->ocap = kept.ocap;
    s->pool = kept.pool; s->pool_cap = kept.pool_cap;
    memset(&kept, 0, sizeof(kept));
    s->used = 0; /* the budget bounds what this scan adds */
}

static void scan_free(Scan *s, int taken) {
    if (s->node_obj) {
        Py_ssize_t hi = s->nn < s->ocap ? s->nn : s->ocap;
        for (Py_ssize_t i = 0; i < hi; i++) Py_CLEAR(s->node_obj[i]);
    }
    if (s->memo) memset(s->memo, 0, (size_t)(s->memo_hi < s->memo_cap ? s->memo_hi : s->memo_cap) * sizeof(Val));
    size_t held = (size_t)s->scap * sizeof(Val) + (size_t)s->mcap * sizeof(Py_ssize_t) +
                  (size_t)s->memo_cap * sizeof(Val) + (size_t)s->vcap * sizeof(Val) + (size_t)s->ccap * sizeof(Chunk) +
                  (size_t)s->ncap * sizeof(Node) + (size_t)s->ocap * sizeof(PyObject *) + (size_t)s->pool_cap;
    if (taken && held <= KEEP_MAX_BYTES) {
        kept.stack = s->stack; kept.scap = s->scap;
        kept.marks = s->marks; kept.mcap = s->mcap;
        kept.memo = s->memo; kept.memo_cap = s->memo_cap;
        kept.vals = s->vals; kept.vcap = s->vcap;
        kept.chunks = s->chunks; kept.ccap = s->ccap;
        kept.nodes = s->nodes; kept.ncap = s->ncap;
        kept.node_obj = s->node_obj; kept.ocap = s->ocap;
        kept.pool = s->pool; kept.pool_cap = s->pool_cap;
    } else {
        PyMem_Free(s->stack); PyMem_Free(s->marks); PyMem_Free(s->memo); PyMem_Free(s->vals);
        PyMem_Free(s->chunks); PyMem_Free(s->nodes); PyMem_Free(s->node_obj); PyMem_Free(s->pool);
    }
    if (taken) kept_busy = 0;
}

static Py_ssize_t fence(Scan *s) { return s->nm ? s->marks[s->nm - 1] : 0; }


static int utf8_ok(const uint8_t *p, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] & 0x80) {
            PyObject *o = PyUnicode_DecodeUTF8((const char *)p, len, "surrogatepass");
            if (!o) { PyErr_Clear(); return 0; }
            Py_DECREF(o);
            return 1;
        }
    }
    return 1;
}

static uint64_t rd_le(const uint8_t *p, int k) {
    uint64_t x = 0;
    for (int i = k - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

/* A scan's arena, with the kept buffers when free (returns whether it took them), over `view`. */
int frscan_begin(Scan *s, const Py_buffer *view, Py_ssize_t budget) {
    memset(s, 0, sizeof(*s));
    int taken = !kept_busy;
    scan_take(s);
    s->d = view->buf;
    s->n = view->len;
    s->budget = budget > 0 ? (size_t)budget : 0;
    s->work = 64 * (int64_t)view->len + 1000000;
    s->keys_left = (int64_t)view->len + 65536;
    return taken;
}

void frscan_end(Scan *s, int taken) {
    scan_free(s, taken);
    PyMem_Free(s->spans);
}

/* The opcode walk. 0: the stream is a plain-containers pickle (s->result is its value); -1: decline. */
static int parse(Scan *s) {
    const uint8_t *d = s->d;
    Py_ssize_t n = s->n, pos, frame_end = -1;
    if (n < 3 || d[0] != 0x80 || d[1] < 2 || d[1] > 5) return -1;
    int proto = d[1];
    pos = 2;
#define NEED(k) do { if ((Py_ssize_t)(k) > n - pos) return -1; } while (0)
    for (;;) {
        if (pos >= n) return -1;
        Py_ssize_t start = pos;
        uint8_t op = d[pos++];
        Val v;
        Py_ssize_t arg = 0;
        switch (op) {
        case '(': /* MARK */
            if (GROW(s, s->marks, s->mcap, s->nm + 1)) return -1;
            s->marks[s->nm++] = s->sp;
            break;
        case '.': /* STOP */
            if (s->nm != 0 || s->sp != 1 || pos != n) return -1;
            if (frame_end >= 0 && start < frame_end && pos > frame_end) return -1;
            s->result = s->stack[0];
            return 0;
        case 'N': if (push(s, (Val){K_NONE, 0, 0})) return -1; break;
        case 0x88: if (push(s, (Val){K_TRUE, 0, 0})) return -1; break;
        case 0x89: if (push(s, (Val){K_FALSE, 0, 0})) return -1; break;
        case 'J':
            NEED(4);
            v = (Val){K_INT, 0, (int64_t)(int32_t)(uint32_t)rd_le(d + pos, 4)};
            pos += 4;
            if (push(s, v)) return -1;
            break;
        case 'K': NEED(1); v = (Val){K_INT, 0, d[pos]}; pos += 1; if (push(s, v)) return -1; break;
        case 'M': NEED(2); v = (Val){K_INT, 0, (int64_t)rd_le(d + pos, 2)}; pos += 2; if (push(s, v)) return -1; break;
        case 0x8a: { /* LONG1: only what fits int64 */
            NEED(1);
            int k = d[pos++];
            if (k > 8) return -1;
            NEED(k);
            int64_t x = 0;
            if (k > 0) {
                uint64_t u = rd_le(d + pos, k);
                if (k < 8 && (d[pos + k - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * k);
                x = (int64_t)u;
            }
            pos += k;
            if (push(s, (Val){K_INT, 0, x})) return -1;
            break;
        }
        case 'G': { /* BINFLOAT, big-endian IEEE 754 */
            NEED(8);
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u = (u << 8) | d[pos + i];
            pos += 8;
            if (push(s, (Val){K_FLOAT, 0, (int64_t)u})) return -1;
            break;
        }
        case 'X': NEED(4); arg = (Py_ssize_t)rd_le(d + pos, 4); pos += 4; goto str;
        case 0x8c: NEED(1); arg = d[pos]; pos += 1; goto str;
        case 0x8d: {
            NEED(8);
            uint64_t u = rd_le(d + pos, 8);
            pos += 8;
            if (u > (uint64_t)(n - pos)) return -1;
            arg = (Py_ssize_t)u;
        }
        str:
            NEED(arg);
            if (arg > 0x7fffffff || !utf8_ok(d + pos, arg)) return -1;
            v = (Val){K_STR, (uint32_t)arg, pos};
            pos += arg;
            if (push(s, v)) return -1;
            break;
        case ']': if (new_node(s, K_LIST, &v) || push(s, v)) return -1; break;
        case '}': if (new_node(s, K_DICT, &v) || push(s, v)) return -1; break;
        case ')': if (new_node(s, K_TUPLE, &v) || push(s, v)) return -1; break;
        case 0x85: case 0x86: case 0x87: { /* TUPLE1-3 */
            Py_ssize_t k = op - 0x84;
            if (s->sp - fence(s) < k) return -1;
            if (new_node(s, K_TUPLE, &v) || add_chunk(s, v.v, s->stack + s->sp - k, k)) return -1;
            s->sp -= k;
            if (push(s, v)) return -1;
            break;
        }
        case 't': { /* TUPLE */
            if (!s->nm) return -1;
            Py_ssize_t m = s->marks[--s->nm];
            if (new_node(s, K_TUPLE, &v) || add_chunk(s, v.v, s->stack + m, s->sp - m)) return -1;
            s->sp = m;
            if (push(s, v)) return -1;
            break;
        }
        case 'a': { /* APPEND */
            if (s->sp - fence(s) < 2) return -1;
            Val *target = &s->stack[s->sp - 2];
            if (target->kind != K_LIST || add_chunk(s, target->v, s->stack + s->sp - 1, 1)) return -1;
            s->sp -= 1;
            break;
        }
        case 'e': case 'u': { /* APPENDS, SETITEMS */
            if (!s->nm) return -1;
            Py_ssize_t m = s->marks[--s->nm];
            if (m <= fence(s)) return -1;
            Val *target = &s->stack[m - 1];
            Py_ssize_t count = s->sp - m;
            if (op == 'e') {
                if (target->kind != K_LIST) return -1;
            } else {
                if (target->kind != K_DICT || (count & 1)) return -1;
                for (Py_ssize_t i = m; i < s->sp; i += 2)
                    if (s->stack[i].kind != K_STR) return -1;
            }
            if (add_chunk(s, target->v, s->stack + m, count)) return -1;
            s->sp = m;
            break;
        }
        case 's': { /* SETITEM */
            if (s->sp - fence(s) < 3) return -1;
            Val *target = &s->stack[s->sp - 3];
            if (target->kind != K_DICT || s->stack[s->sp - 2].kind != K_STR) return -1;
            if (add_chunk(s, target->v, s->stack + s->sp - 2, 2)) return -1;
            s->sp -= 2;
            break;
        }
        case 'q': NEED(1); arg = d[pos]; pos += 1; goto put;
        case 'r': NEED(4); arg = (Py_ssize_t)rd_le(d + pos, 4); pos += 4; goto put;
        case 0x94: arg = s->memo_count; goto put;
        put:
            if (s->sp <= fence(s) || arg > n) return -1;
            if (arg >= s->memo_cap) {
                Py_ssize_t old = s->memo_cap;
                if (GROW(s, s->memo, s->memo_cap, arg + 1)) return -1;
                memset(s->memo + old, 0, (size_t)(s->memo_cap - old) * sizeof(Val));
            }
            if (s->memo[arg].kind == K_UNSET) s->memo_count++;
            if (arg >= s->memo_hi) s->memo_hi = arg + 1;
            s->memo[arg] = s->stack[s->sp - 1];
            break;
        case 'h': NEED(1); arg = d[pos]; pos += 1; goto get;
        case 'j': NEED(4); arg = (Py_ssize_t)rd_le(d + pos, 4); pos += 4; goto get;
        get:
            if (arg >= s->memo_cap || s->memo[arg].kind == K_UNSET) return -1;
            if (push(s, s->memo[arg])) return -1;
            break;
        case 0x95: { /* FRAME */
            if (proto < 4 || (frame_end >= 0 && start < frame_end)) return -1;
            NEED(8);
            uint64_t u = rd_le(d + pos, 8);
            pos += 8;
            if (u > (uint64_t)(n - pos)) return -1;
            frame_end = pos + (Py_ssize_t)u;
            continue;
        }
        default:
            return -1; /* GLOBAL, REDUCE, BUILD, PERSID, bytes, protocol-0 forms...: not for this reader */
        }
        if (frame_end >= 0 && start < frame_end && pos > frame_end) return -1;
    }
#undef NEED
}

/* --- encodings (content keys) and materialization ------------------------------------------------ */

typedef struct { uint8_t *p; Py_ssize_t len, cap; } Buf;

static inline int put(Scan *s, Buf *b, const void *src, Py_ssize_t k) {
    if (b->len + k > b->cap && GROW(s, b->p, b->cap, b->len + k)) return -1;
    memcpy(b->p + b->len, src, (size_t)k);
    b->len += k;
    return 0;
}

static inline int put_tag(Scan *s, Buf *b, uint8_t tag, int64_t x) {
    if (b->len + 9 > b->cap && GROW(s, b->p, b->cap, b->len + 9)) return -1;
    b->p[b->len] = tag;
    memcpy(b->p + b->len + 1, &x, 8); /* a fixed size: inlined */
    b->len += 9;
    return 0;
}

/* Content key of a value: equal keys <=> equal Python values (for what it accepts: no floats, no dicts except a
 * frame dict by identity when `dicts_by_node`). */
static int enc(Scan *s, Buf *b, const Val *v, int depth, int dicts_by_node) {
    if (--s->work < 0 || depth > MAX_DEPTH) return -1;
    switch (v->kind) {
    case K_NONE: return put_tag(s, b, 'N', 0);
    case K_TRUE: return put_tag(s, b, 'T', 0);
    case K_FALSE: return put_tag(s, b, 'F', 0);
    case K_INT: return put_tag(s, b, 'I', v->v);
    case K_STR:
        s->work -= v->len >> 6;
        if (put_tag(s, b, 'S', v->len)) return -1;
        return put(s, b, s->d + v->v, v->len);
    case K_LIST: case K_TUPLE: {
        int64_t node = v->v;
        if (put_tag(s, b, v->kind == K_LIST ? 'L' : 'U', s->nodes[node].count)) return -1;
        int rc = 0;
        EACH_CHILD(s, node, c, {
            if (dicts_by_node && c->kind == K_DICT) rc = put_tag(s, b, 'D', c->v);
            else rc = enc(s, b, c, depth + 1, 0);
            if (rc) return -1;
        });
        return 0;
    }
    default:
        return -1;
    }
}

static PyObject *mat(Scan *s, const Val *v, int depth) {
    if (--s->work < 0 || depth > MAX_DEPTH) return NULL;
    switch (v->kind) {
    case K_NONE: Py_RETURN_NONE;
    case K_TRUE: Py_RETURN_TRUE;
    case K_FALSE: Py_RETURN_FALSE;
    case K_INT: return PyLong_FromLongLong(v->v);
    case K_FLOAT: {
        double x;
        uint64_t u = (uint64_t)v->v;
        memcpy(&x, &u, 8);
        return PyFloat_FromDouble(x);
    }
    case K_STR:
        s->work -= v->len >> 6;
        return PyUnicode_DecodeUTF8((const char *)s->d + v->v, v->len, "surrogatepass");
    case K_LIST: case K_TUPLE: case K_DICT: {
        int64_t node = v->v;
        PyObject *o = s->node_obj[node];
        if (o) { Py_INCREF(o); return o; }
        Py_ssize_t count = (Py_ssize_t)s->nodes[node].count, i = 0;
        o = v->kind == K_LIST ? PyList_New(count) : v->kind == K_TUPLE ? PyTuple_New(count) : PyDict_New();
        if (!o) return NULL;
        if (v->kind == K_DICT) {
            const Val *key = NULL;
            EACH_CHILD(s, node, c, {
                if (!key) { key = c; continue; }
                PyObject *k = mat(s, key, depth + 1), *x = k ? mat(s, c, depth + 1) : NULL;
                int rc = x ? PyDict_SetItem(o, k, x) : -1;
                Py_XDECREF(k); Py_XDECREF(x);
                key = NULL;
                if (rc) { Py_DECREF(o); return NULL; }
            });
        } else {
            EACH_CHILD(s, node, c, {
                PyObject *x = mat(s, c, depth + 1);
                if (!x) { Py_DECREF(o); return NULL; }
                if (v->kind == K_LIST) PyList_SET_ITEM(o, i, x); else PyTuple_SET_ITEM(o, i, x);
                i++;
            });
        }
        Py_INCREF(o);
        s->node_obj[node] = o;
        return o;
    }
    default:
        return NULL;
    }
}

/* --- interning ----------------------------------------------------------------------------------- */

typedef struct { uint64_t h; int64_t off; int64_t len; int64_t code; } Slot;
typedef struct { int64_t kind, v, code; } Ident;

typedef struct {
    Slot *slots; Py_ssize_t cap, count;
    Buf keys;
    PyObject *objs; /* list: the distinct values, in order of first appearance */
    uint32_t *codes; Py_ssize_t ncodes, codes_cap;
    Ident ident[256]; /* single-value identity cache: the same str offset / node / int is the same content */
    Ident pair[64][2]; /* two-value keys (threads) by identity, as `ident`; code + 1 in pair[.][0].code */
} Interner;

static void interner_free(Interner *t) {
    PyMem_Free(t->slots); PyMem_Free(t->keys.p); PyMem_Free(t->codes);
    Py_XDECREF(t->objs);
}

static uint64_t fnv(const uint8_t *p, Py_ssize_t len) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)len;
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < len; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    return h ^ (h >> 32);
}

/* Probes of one lookup past which the scan declines: the hash is not keyed, and values crafted to collide would
 * otherwise make every insertion walk one growing cluster (quadratic; at 50% load a fair hash never comes near). */
#define INTERN_MAX_PROBE 64

/* The code of key (b->p, b->len); -1 on error; *fresh set when it is new (the caller appends its object). */
static int64_t intern_key(Scan *s, Interner *t, const Buf *b, int *fresh) {
    *fresh = 0;
    if (t->count * 2 >= t->cap) {
        Py_ssize_t ncap = t->cap ? t->cap * 2 : 64;
        if (s->used + (size_t)ncap * sizeof(Slot) > s->budget) return -1;
        Slot *ns = PyMem_Calloc((size_t)ncap, sizeof(Slot));
        if (!ns) return -1;
        for (Py_ssize_t i = 0; i < t->cap; i++) {
            if (!t->slots[i].len) continue;
            Py_ssize_t j = (Py_ssize_t)(t->slots[i].h & (uint64_t)(ncap - 1));
            while (ns[j].len) j = (j + 1) & (ncap - 1);
            ns[j] = t->slots[i];
        }
        s->used += (size_t)(ncap - t->cap) * sizeof(Slot);
        PyMem_Free(t->slots);
        t->slots = ns;
        t->cap = ncap;
    }
    uint64_t h = fnv(b->p, b->len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->cap - 1));
    for (int probes = 0; t->slots[j].len; probes++) {
        Slot *sl = &t->slots[j];
        if (sl->h == h && sl->len == b->len && !memcmp(t->keys.p + sl->off, b->p, (size_t)b->len)) return sl->code;
        if (probes >= INTERN_MAX_PROBE) return -1;
        j = (j + 1) & (t->cap - 1);
    }
    Py_ssize_t off = t->keys.len;
    if (put(s, &t->keys, b->p, b->len)) return -1;
    t->slots[j] = (Slot){h, off, b->len, t->count};
    *fresh = 1;
    return t->count++;
}

static int add_code(Scan *s, Interner *t, int64_t code) {
    if (GROW(s, t->codes, t->codes_cap, t->ncodes + 1)) return -1;
    t->codes[t->ncodes++] = (uint32_t)code;
    return 0;
}

/* A stack's frames as records.model.frames_from_raw reads them, each a (name, filename, line) tuple: a dict item's
 * "name" (str, first 200 characters, else "?"), "filename" (first 500, else "?") and "line" (an int in [0, 2**31),
 * else -1); items that are not dicts are skipped. Equal frames are one tuple object across the scans of a process
 * (`frame_cache`, bounded): every rank runs the same code, so each file's stacks cost a lookup per frame. */
static PyObject *frame_cache;
#define FRAME_CACHE_MAX 65536
#define FRAME_KEY_MAX 4096
#define FRAME_NAME_MAX 200
#define FRAME_FILE_MAX 500

static PyObject *frame_text(Scan *s, const Val *v, Py_ssize_t cap) {
    if (!v || v->kind != K_STR) return PyUnicode_FromString("?");
    s->work -= v->len >> 6;
    PyObject *o = PyUnicode_DecodeUTF8((const char *)s->d + v->v, v->len, "surrogatepass");
    if (o && PyUnicode_GET_LENGTH(o) > cap) {
        PyObject *t = PyUnicode_Substring(o, 0, cap);
        Py_DECREF(o);
        o = t;
    }
    return o;
}

static PyObject *mat_frame(Scan *s, const Val *dict, Buf *key) {
    const Val *name = NULL, *file = NULL, *line = NULL, *k = NULL;
    if ((s->keys_left -= s->nodes[dict->v].count) < 0) return NULL; /* each of its keys is looked at */
    EACH_CHILD(s, dict->v, c, {
        if (!k) { k = c; continue; }
        if (k->len == 4 && !memcmp(s->d + k->v, "name", 4)) name = c;
        else if (k->len == 8 && !memcmp(s->d + k->v, "filename", 8)) file = c;
        else if (k->len == 4 && !memcmp(s->d + k->v, "line", 4)) line = c;
        k = NULL;
    });
    int64_t line_no = line && line->kind == K_INT && line->v >= 0 && line->v < ((int64_t)1 << 31) ? line->v : -1;
    key->len = 0;
    if (put_tag(s, key, 'L', line_no)) return NULL;
    if (name && name->kind == K_STR) { if (put_tag(s, key, 'S', name->len) || put(s, key, s->d + name->v, name->len)) return NULL; }
    else if (put_tag(s, key, '?', 0)) return NULL;
    if (file && file->kind == K_STR) { if (put_tag(s, key, 'S', file->len) || put(s, key, s->d + file->v, file->len)) return NULL; }
    else if (put_tag(s, key, '?', 0)) return NULL;
    if (!frame_cache && !(frame_cache = PyDict_New())) return NULL;
    PyObject *kb = PyBytes_FromStringAndSize((const char *)key->p, key->len);
    if (!kb) return NULL;
    PyObject *got = PyDict_GetItemWithError(frame_cache, kb);
    if (got) { Py_DECREF(kb); Py_INCREF(got); return got; }
    if (PyErr_Occurred()) { Py_DECREF(kb); return NULL; }
    PyObject *frame = Py_BuildValue("(NNL)", frame_text(s, name, FRAME_NAME_MAX), frame_text(s, file, FRAME_FILE_MAX),
                                    (long long)line_no);
    /* Bounded: at most FRAME_CACHE_MAX frames of at most FRAME_KEY_MAX bytes each, whatever the files hold. */
    if (frame && key->len <= FRAME_KEY_MAX && PyDict_GET_SIZE(frame_cache) < FRAME_CACHE_MAX &&
        PyDict_SetItem(frame_cache, kb, frame)) {
        Py_CLEAR(frame);
    }
    Py_DECREF(kb);
    return frame;
}

static PyObject *mat_stack(Scan *s, const Val *v) {
    if (v->kind != K_LIST) return NULL;
    Py_ssize_t dicts = 0, i = 0;
    EACH_CHILD(s, v->v, c, { if (c->kind == K_DICT) dicts++; });
    PyObject *out = PyTuple_New(dicts);
    if (!out) return NULL;
    Buf key = {0};
    EACH_CHILD(s, v->v, c, {
        if (c->kind != K_DICT) continue;
        if (--s->work < 0) goto fail;
        PyObject *frame = mat_frame(s, c, &key);
        if (!frame) goto fail;
        PyTuple_SET_ITEM(out, i, frame);
        i++;
    });
    PyMem_Free(key.p);
    return out;
fail:
    PyMem_Free(key.p);
    Py_DECREF(out);
    return NULL;
}

/* The code of one value, content-keyed; identity first. mode 0: plain; 1: a group pair (list or tuple alike, a
 * tuple object); 2: a stack (frame dicts by node). */
static int64_t intern_val(Scan *s, Interner *t, Buf *b, const Val *v, int mode) {
    uint64_t slot = ((uint64_t)v->v * 0x9E3779B97F4A7C15ULL + v->kind) >> 56;
    Ident *id = &t->ident[slot];
    if (id->code > 0 && id->kind == v->kind && id->v == v->v) return id->code - 1;
    b->len = 0;
    int rc;
    if (mode == 1) {
        if (v->kind != K_LIST && v->kind != K_TUPLE) return -1;
        rc = put_tag(s, b, 'P', s->nodes[v->v].count);
        EACH_CHILD(s, v->v, c, { if (!rc) rc = enc(s, b, c, 1, 0); });
    } else {
        rc = enc(s, b, v, 0, mode == 2);
    }
    if (rc) return -1;
    int fresh;
    int64_t code = intern_key(s, t, b, &fresh);
    if (code < 0) return -1;
    if (fresh) {
        PyObject *o;
        if (mode == 1) {
            o = PyTuple_New((Py_ssize_t)s->nodes[v->v].count);
            Py_ssize_t i = 0;
            if (o) EACH_CHILD(s, v->v, c, {
                PyObject *x = mat(s, c, 1);
                if (!x) { Py_DECREF(o); o = NULL; goto done; }
                PyTuple_SET_ITEM(o, i, x);
                i++;
            });
        } else if (mode == 2) {
            o = mat_stack(s, v);
        } else {
            o = mat(s, v, 0);
        }
    done:
        if (!o || PyList_Append(t->objs, o)) { Py_XDECREF(o); return -1; }
        Py_DECREF(o);
    }
    if (v->kind == K_STR || v->kind >= K_LIST || v->kind == K_INT || v->kind == K_NONE)
        *id = (Ident){v->kind, v->v, code + 1};
    return code;
}

/* A key made of several values (shapes: 4; threads: 2), materialized as a tuple of them. */
static int64_t intern_multi_keyed(Scan *s, Interner *t, Buf *b, Val **vs, int k);

/* Identity stands for content for strings (an offset into the input), ints, None, bools and containers (a node). */
static inline int by_identity(const Val *v) { return v->kind != K_FLOAT && v->kind != K_UNSET; }

static int64_t intern_multi(Scan *s, Interner *t, Buf *b, Val **vs, int k) {
    Ident *pair = NULL;
    if (k == 2 && by_identity(vs[0]) && by_identity(vs[1])) {
        uint64_t h = ((uint64_t)vs[0]->v * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)vs[1]->v * 0xC2B2AE3D27D4EB4FULL) ^
                     ((uint64_t)vs[0]->kind << 8 | vs[1]->kind);
        pair = t->pair[(h >> 40) & 63];
        if (pair[0].code > 0 && pair[0].kind == vs[0]->kind && pair[0].v == vs[0]->v && pair[1].kind == vs[1]->kind &&
            pair[1].v == vs[1]->v)
            return pair[0].code - 1;
    }
    int64_t got = intern_multi_keyed(s, t, b, vs, k);
    if (got >= 0 && pair) {
        pair[0] = (Ident){vs[0]->kind, vs[0]->v, got + 1};
        pair[1] = (Ident){vs[1]->kind, vs[1]->v, 0};
    }
    return got;
}

static int64_t intern_multi_keyed(Scan *s, Interner *t, Buf *b, Val **vs, int k) {
    b->len = 0;
    for (int i = 0; i < k; i++)
        if (enc(s, b, vs[i], 0, 0)) return -1;
    int fresh;
    int64_t code = intern_key(s, t, b, &fresh);
    if (code < 0) return -1;
    if (fresh) {
        PyObject *o = PyTuple_New(k);
        if (!o) return -1;
        for (int i = 0; i < k; i++) {
            PyObject *x = mat(s, vs[i], 1);
            if (!x) { Py_DECREF(o); return -1; }
            PyTuple_SET_ITEM(o, i, x);
        }
        if (PyList_Append(t->objs, o)) { Py_DECREF(o); return -1; }
        Py_DECREF(o);
    }
    return code;
}

/* --- the entries --------------------------------------------------------------------------------- */

/* The entry fields (their enum, names and lowest values) come from frscope/records/fields.py, the one table
   the Python readers use too. */
#include "_frscan_fields.h"

#define KCACHE 256
static size_t FIELD_LENS[F_COUNT];

static int field_of(Scan *s, const Val *key, int64_t cache[KCACHE][2]) {
    /* keys are memoized strings: one offset per distinct key, looked up once */
    uint64_t slot = ((uint64_t)key->v * 0x9E3779B97F4A7C15ULL) >> 56;
    if (cache[slot][0] == key->v + 1) return (int)cache[slot][1];
    int found = -1;
    for (int f = 0; f < F_COUNT; f++) {
        size_t len = FIELD_LENS[f];
        if (len == key->len && !memcmp(s->d + key->v, FIELD_NAMES[f], len)) { found = f; break; }
    }
    cache[slot][0] = key->v + 1;
    cache[slot][1] = found;
    return found;
}

static PyObject *narrow(Interner *t) {
    /* codes in the width EntryTable's _code_type picks for this many distinct values */
    Py_ssize_t distinct = PyList_GET_SIZE(t->objs), n = t->ncodes;
    int w = distinct <= 256 ? 1 : distinct <= 65536 ? 2 : 4;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * w);
    if (!out) return NULL;
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t c = t->codes[i];
        if (w == 1) ((uint8_t *)p)[i] = (uint8_t)c;
        else if (w == 2) { uint16_t x = (uint16_t)c; memcpy(p + 2 * i, &x, 2); }
        else memcpy(p + 4 * i, &c, 4);
    }
    return out;
}

enum { T_PG, T_NAME, T_STATE, T_TIMEOUT, T_THREAD, T_SHAPE, T_STACK, T_COUNT };

/* A dump's top-level dict (or a piece's trace) as a Python dict whose "entries" are an empty list: the table
 * carries them. NULL: failed. */
static PyObject *mat_meta(Scan *s, const Val *dict) {
    PyObject *meta = PyDict_New();
    if (!meta) return NULL;
    const Val *key = NULL;
    EACH_CHILD(s, dict->v, c, {
        if (!key) { key = c; continue; }
        PyObject *k = mat(s, key, 1), *x = NULL;
        if (k) x = is_key(s, key, "entries", 7) ? PyList_New(0) : mat(s, c, 1);
        int rc = x ? PyDict_SetItem(meta, k, x) : -1;
        Py_XDECREF(k); Py_XDECREF(x);
        key = NULL;
        if (rc) { Py_DECREF(meta); return NULL; }
    });
    return meta;
}

/* `last` > 0: only the newest `last` entries (wire.window_piece's cut), as if the others were not there. */
PyObject *frscan_extract(Scan *s, int pieces, Py_ssize_t last) {
    PyObject *meta = NULL, *result = NULL, *counts = NULL;
    Interner tabs[T_COUNT];
    memset(tabs, 0, sizeof(tabs));
    int64_t *ints = NULL, *last_stack = NULL;
    double *dur = NULL;
    uint8_t *flags = NULL;
    Buf b = {0};
    Py_ssize_t last_cap = 0;
    Val top = s->result;
    if (top.kind != K_DICT) return NULL;
    Py_ssize_t old_ocap = s->ocap; /* a kept buffer is all NULL; a grown part is zeroed here */
    if (GROW(s, s->node_obj, s->ocap, s->nn + 1)) return NULL;
    memset(s->node_obj + old_ocap, 0, (size_t)(s->ocap - old_ocap) * sizeof(PyObject *));

    /* The top level: everything but the entries as Python objects (normalize reads them); the entries' list.
     * `pieces`: a snapshot piece's (a frscope_snapshot key and a trace) entries are its trace's, as
     * wire.unwrap_snapshot reads it; the trace's other fields stay in meta's "trace". */
    const Val *holder = &top, *trace = NULL, *key = NULL;
    int snapshot = 0;
    if (pieces) {
        EACH_CHILD(s, top.v, c, {
            if (!key) { key = c; continue; }
            if (is_key(s, key, "trace", 5)) trace = c; /* a repeated key: the last one wins, as in a dict */
            else if (is_key(s, key, "frscope_snapshot", 16)) snapshot = 1;
            key = NULL;
        });
        if (trace && snapshot) {
            if (trace->kind != K_DICT) return NULL;
            holder = trace;
        }
    }
    const Val *entries = NULL;
    key = NULL;
    EACH_CHILD(s, holder->v, c, {
        if (!key) { key = c; continue; }
        if (is_key(s, key, "entries", 7)) entries = c;
        key = NULL;
    });
    if (!entries || entries->kind != K_LIST || s->nodes[entries->v].count == 0) return NULL;
    int64_t saved = s->work;
    s->work = s->n / 4 + 100000;
    if (holder == &top) meta = mat_meta(s, &top);
    else if ((meta = PyDict_New())) {
        key = NULL;
        EACH_CHILD(s, top.v, c, {
            if (!key) { key = c; continue; }
            PyObject *k = mat(s, key, 1), *x = NULL;
            if (k) x = c == trace ? mat_meta(s, c) : mat(s, c, 1);
            int rc = x ? PyDict_SetItem(meta, k, x) : -1;
            Py_XDECREF(k); Py_XDECREF(x);
            key = NULL;
            if (rc) goto fail;
        });
    }
    if (!meta) goto fail;
    s->work = saved;

    Py_ssize_t total = (Py_ssize_t)s->nodes[entries->v].count;
    Py_ssize_t skip = last > 0 && total > last ? total - last : 0, n = total - skip;
    size_t need = (size_t)n * (6 * 8 + 8 + 1 + T_COUNT * 4);
    if (s->used + need > s->budget) goto fail;
    if (!(ints = PyMem_Malloc((size_t)n * 6 * 8)) || !(dur = PyMem_Malloc((size_t)n * 8)) ||
        !(flags = PyMem_Malloc((size_t)n))) goto fail;
    s->used += (size_t)n * (6 * 8 + 8 + 1);
    for (int t = 0; t < T_COUNT; t++)
        if (!(tabs[t].objs = PyList_New(0)) || GROW(s, tabs[t].codes, tabs[t].codes_cap, n)) goto fail;

    int64_t kcache[KCACHE][2];
    memset(kcache, 0, sizeof(kcache));
    int stacks_failed = 0, ids_rise = 1, frames_state = -1;
    int64_t refs = 0;
    Py_ssize_t i = 0;
    Val *fv[F_COUNT];
    EACH_CHILD(s, entries->v, e, {
        if (skip > 0) { skip--; continue; }
        if (e->kind != K_DICT) goto fail;
        if ((s->keys_left -= s->nodes[e->v].count) < 0) goto fail; /* each of its keys is looked at */
        for (int f = 0; f < F_COUNT; f++) fv[f] = NULL;
        const Val *k2 = NULL;
        EACH_CHILD(s, e->v, c, {
            if (!k2) { k2 = c; continue; }
            int f = field_of(s, k2, kcache);
            if (f >= 0) fv[f] = c; /* a repeated key: the last one wins, as in a dict */
            k2 = NULL;
        });
        for (int f = 0; f < F_REQUIRED; f++) if (!fv[f]) goto fail;
        {   /* 0: no entry has frames; 1: every entry's are an empty list; 2: anything else */
            const Val *fr = fv[F_FRAMES];
            int st = !fr ? 0 : fr->kind == K_LIST && s->nodes[fr->v].count == 0 ? 1 : 2;
            frames_state = frames_state < 0 || frames_state == st ? st : 2;
        }
        int64_t *row = ints + 6 * i;
        if (fv[F_RECORD_ID]->kind != K_INT || fv[F_RECORD_ID]->v < FIELD_MIN[F_RECORD_ID]) goto fail;
        if (fv[F_SEQ]->kind != K_INT || fv[F_SEQ]->v < FIELD_MIN[F_SEQ]) goto fail;
        if (fv[F_P2P_SEQ]->kind != K_INT || fv[F_P2P_SEQ]->v < FIELD_MIN[F_P2P_SEQ]) goto fail;
        if (i > 0 && fv[F_RECORD_ID]->v <= ints[6 * (i - 1)]) ids_rise = 0;
        row[0] = fv[F_RECORD_ID]->v;
        row[1] = fv[F_SEQ]->v;
        row[2] = fv[F_P2P_SEQ]->v;
        static const int TIMES[3] = {F_CREATED, F_STARTED, F_COMPLETED};
        for (int t = 0; t < 3; t++) {
            Val *x = fv[TIMES[t]];
            if (x->kind == K_NONE) row[3 + t] = 0;
            else if (x->kind == K_INT && x->v >= FIELD_MIN[TIMES[t]]) row[3 + t] = x->v;
            else goto fail;
        }
        int64_t code;
        if ((code = intern_val(s, &tabs[T_PG], &b, fv[F_PG], 1)) < 0 || add_code(s, &tabs[T_PG], code)) goto fail;
        if (fv[F_NAME]->kind != K_STR) goto fail;
        int64_t op = intern_val(s, &tabs[T_NAME], &b, fv[F_NAME], 0);
        if (op < 0 || add_code(s, &tabs[T_NAME], op)) goto fail;
        uint32_t k_p2p = fv[F_IS_P2P]->kind, k_ret = fv[F_RETIRED]->kind;
        if ((k_p2p != K_TRUE && k_p2p != K_FALSE) || (k_ret != K_NONE && k_ret != K_TRUE && k_ret != K_FALSE))
            goto fail;
        flags[i] = (uint8_t)((k_p2p == K_TRUE) + (k_ret == K_FALSE ? 2 : k_ret == K_TRUE ? 4 : 0));
        if (fv[F_STATE]->kind != K_STR) goto fail;
        if ((code = intern_val(s, &tabs[T_STATE], &b, fv[F_STATE], 0)) < 0 || add_code(s, &tabs[T_STATE], code))
            goto fail;
        if (fv[F_TIMEOUT]->kind != K_NONE && fv[F_TIMEOUT]->kind != K_INT) goto fail;
        if ((code = intern_val(s, &tabs[T_TIMEOUT], &b, fv[F_TIMEOUT], 0)) < 0 ||
            add_code(s, &tabs[T_TIMEOUT], code)) goto fail;
        for (int t = F_THREAD_ID; t <= F_THREAD_NAME; t++)
            if (fv[t]->kind != K_NONE && fv[t]->kind != K_STR) goto fail;
        if ((code = intern_multi(s, &tabs[T_THREAD], &b, fv + F_THREAD_ID, 2)) < 0 ||
            add_code(s, &tabs[T_THREAD], code)) goto fail;
        Val *dv = fv[F_DURATION];
        if (!dv || dv->kind == K_NONE) dur[i] = Py_NAN;
        else if (dv->kind == K_FLOAT) {
            double x;
            uint64_t u = (uint64_t)dv->v;
            memcpy(&x, &u, 8);
            dur[i] = (x >= 0.0 && x <= MAX_DURATION_MS) ? x : Py_NAN;
        } else goto fail;
        if ((code = intern_multi(s, &tabs[T_SHAPE], &b, fv + F_IN_SIZES, 4)) < 0 || add_code(s, &tabs[T_SHAPE], code))
            goto fail;
        if (!stacks_failed) {
            Val *fr = fv[F_FRAMES];
            if (!fr || fr->kind != K_LIST) stacks_failed = 1;
            else {
                if ((code = intern_val(s, &tabs[T_STACK], &b, fr, 2)) < 0 || add_code(s, &tabs[T_STACK], code))
                    goto fail;
                if (op >= last_cap) {
                    Py_ssize_t old = last_cap;
                    if (GROW(s, last_stack, last_cap, op + 1)) goto fail;
                    for (Py_ssize_t j = old; j < last_cap; j++) last_stack[j] = -1;
                }
                if (last_stack[op] != code) {
                    /* fastcols counts the frames of every change of an op's stack; this counts at least as many */
                    refs += s->nodes[fr->v].count;
                    if (refs > MAX_FRAME_REFS) goto fail;
                    last_stack[op] = code;
                }
            }
        }
        i++;
    });

    if (!(counts = PyList_New(PyList_GET_SIZE(tabs[T_NAME].objs)))) goto fail;
    {
        Py_ssize_t nn = PyList_GET_SIZE(tabs[T_NAME].objs);
        int64_t *cnt = PyMem_Calloc((size_t)(nn ? nn : 1), sizeof(int64_t));
        if (!cnt) goto fail;
        for (Py_ssize_t j = 0; j < n; j++) cnt[tabs[T_NAME].codes[j]]++;
        for (Py_ssize_t j = 0; j < nn; j++) {
            PyObject *x = PyLong_FromLongLong(cnt[j]);
            if (!x) { PyMem_Free(cnt); goto fail; }
            PyList_SET_ITEM(counts, j, x);
        }
        PyMem_Free(cnt);
    }
    {
        PyObject *cols = PyBytes_FromStringAndSize(NULL, n * 6 * 8);
        if (!cols) goto fail;
        int64_t *out = (int64_t *)PyBytes_AS_STRING(cols);
        for (int c = 0; c < 6; c++)
            for (Py_ssize_t j = 0; j < n; j++) out[c * n + j] = ints[6 * j + c];
        PyObject *items[24] = {
            meta, PyLong_FromSsize_t(n), cols, PyBytes_FromStringAndSize((const char *)dur, n * 8),
            PyBytes_FromStringAndSize((const char *)flags, n),
            narrow(&tabs[T_PG]), tabs[T_PG].objs, tabs[T_NAME].objs, narrow(&tabs[T_NAME]), counts,
            tabs[T_STATE].objs, narrow(&tabs[T_STATE]), tabs[T_TIMEOUT].objs, narrow(&tabs[T_TIMEOUT]),
            tabs[T_THREAD].objs, narrow(&tabs[T_THREAD]), tabs[T_SHAPE].objs, narrow(&tabs[T_SHAPE]),
            stacks_failed ? Py_None : PyBytes_FromStringAndSize((const char *)tabs[T_STACK].codes, n * 4),
            stacks_failed ? Py_None : tabs[T_STACK].objs,
            ids_rise ? Py_True : Py_False,
            PyLong_FromSsize_t(total), /* the entries before the cut to `last` */
            PyLong_FromLong(frames_state), /* the entries' frames: 0 none, 1 all [], 2 other */
            PyLong_FromSsize_t(s->end), /* JSON: where the value ends */
        };
        /* borrowed ones: meta, the tables' lists, counts, None, the bools; the others are new */
        static const int BORROWED[24] = {1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0};
        int ok = 1;
        for (int j = 0; j < 24; j++) {
            int borrowed = BORROWED[j] || (j == 18 && stacks_failed);
            if (!items[j]) ok = 0;
            else if (borrowed) Py_INCREF(items[j]);
        }
        if (ok && (result = PyTuple_New(24))) {
            for (int j = 0; j < 24; j++) PyTuple_SET_ITEM(result, j, items[j]);
        } else {
            for (int j = 0; j < 24; j++) Py_XDECREF(items[j]);
        }
    }
fail:
    Py_XDECREF(meta);
    Py_XDECREF(counts);
    for (int t = 0; t < T_COUNT; t++) interner_free(&tabs[t]);
    PyMem_Free(ints); PyMem_Free(dur); PyMem_Free(flags); PyMem_Free(last_stack); PyMem_Free(b.p);
    return result;
}

/* One scan: a front-end (the pickle walk or the JSON parser) fills the arena, `extract` reads it. */
static PyObject *scan_with(PyObject *args, int (*front)(Scan *), int json) {
    Py_buffer view;
    Py_ssize_t budget;
    int pieces = 0, prefix = 0;
    Py_ssize_t last = 0;
    if (!PyArg_ParseTuple(args, json ? "y*n|pnp" : "y*n", &view, &budget, &pieces, &last, &prefix)) return NULL;
    Scan s;
    int taken = frscan_begin(&s, &view, budget);
    s.prefix = prefix;
    PyObject *out = NULL;
    if (front(&s) == 0) out = frscan_extract(&s, pieces, last);
    frscan_end(&s, taken);
    PyBuffer_Release(&view);
    if (!out) {
        PyErr_Clear(); /* declined: MemoryError included; the reference path reads (and judges) the file */
        Py_RETURN_NONE;
    }
    return out;
}

static PyObject *py_scan(PyObject *self, PyObject *args) { return scan_with(args, parse, 0); }

static PyObject *py_scan_json(PyObject *self, PyObject *args) { return scan_with(args, frscan_parse_json, 1); }

PyObject *frscan_scan_envelope(PyObject *self, PyObject *args); /* _frscan_json.c */
PyObject *frscan_index_contiguous(PyObject *self, PyObject *args); /* _frscan_groups.c */
PyObject *frscan_narrow(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS,
     "scan(data, budget) -> tuple of columns, or None when the pickle is not a regular Flight Recorder dump"},
    {"scan_json", py_scan_json, METH_VARARGS,
     "scan_json(data, budget, pieces=False, last=0, prefix=False) -> the same for JSON text (`pieces`: a snapshot "
     "piece's entries are its trace's; `last` > 0: only the newest `last` entries; `prefix`: the value may be "
     "followed by anything, its end is the last item), or None"},
    {"scan_envelope", frscan_scan_envelope, METH_VARARGS,
     "scan_envelope(data, budget, last, max_pieces) -> (ranks_start, ranks_end, [(start, end, columns or None) "
     "per piece]) for a snapshot envelope's JSON text, or None"},
    {"index_contiguous", frscan_index_contiguous, METH_VARARGS,
     "index_contiguous(gid, ngroups, flags, state, done, seq, name, op_of_name, shape, shape_count) -> "
     "(groups, keys), or None when a group's seqs are not consecutive (group_index.index_groups)"},
    {"narrow", frscan_narrow, METH_VARARGS,
     "narrow(column, signed) -> (typecode, bytes): the ints in the smallest array type that holds them"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frscan(void) {
    for (int f = 0; f < F_COUNT; f++) FIELD_LENS[f] = strlen(FIELD_NAMES[f]);
    return PyModule_Create(&module);
}
