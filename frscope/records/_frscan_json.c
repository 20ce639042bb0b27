/* _frscan's JSON front-end: a Flight Recorder dump's JSON text (torch's `_dump_fr_trace_json`, the worker
 * server's `fr_trace_json`, frscope's snapshot pieces) into the same arena the pickle walk fills (_frscan.c), for
 * the same `extract`. The reference is Python's `json.loads` of the bytes (then the normalizer); this parser
 * gives the same values for what it accepts and declines (-1) everything else, so that the caller reads the file
 * the reference way, which reports whatever is wrong with it:
 *
 * - RFC 8259 grammar only, whitespace space/tab/CR/LF; no BOM, no NaN / Infinity literals (Python accepts
 *   those: declined, never read differently), nothing but whitespace after the value;
 * - strings: every escape, \uXXXX and surrogate pairs to UTF-8; a lone surrogate (escaped or encoded), invalid or
 *   overlong UTF-8, a raw control character: declined. Escaped strings are decoded into a copy of the input, at
 *   their own offset (a decoded string is never longer than its escaped form), so that a string is an (offset,
 *   length) into `s->d` as in the pickle walk;
 * - numbers: an int (no fraction, no exponent) within int64 as an int, a longer one declined; a float through
 *   PyOS_string_to_double, as Python's float() (and so json) parses it;
 * - nesting deeper than MAX_JSON_DEPTH: declined. Memory: every buffer through the arena's budget. Time: one pass,
 *   each byte read a bounded number of times (a float's digits are copied once more, at most FLOAT_MAX chars).
 *
 * Equal short strings (keys, op names, states) share one offset, as the pickle's memo makes them share one: the
 * extractor's identity caches (field names, interned values) then hit as they do for pickles. */
#include "_frscan_arena.h"

#define MAX_JSON_DEPTH 64
#define FLOAT_MAX 400
#define SHARE_MAX_LEN 96         /* strings up to this long share an offset with an earlier equal one */
#define SHARE_MAX_SLOTS (1 << 17) /* the sharing table stops growing here (then only looks up) */
#define SHARE_MAX_PROBE 16        /* a string whose lookup walks further is not shared (crafted collisions) */

typedef struct { uint64_t h; int64_t off; int64_t len; } Shared;
typedef struct { Shared *slots; Py_ssize_t cap, count; } ShareTable;

static inline uint64_t str_hash(const uint8_t *p, Py_ssize_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)len;
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xC2B2AE3D27D4EB4FULL;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, p + i, (size_t)(len - i));
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
}

/* The offset of an earlier string equal to d[off, off+len), else off (remembered for the next). -1: no memory. */
static int64_t share(Scan *s, ShareTable *t, int64_t off, Py_ssize_t len) {
    if (len == 0 || len > SHARE_MAX_LEN) return off;
    if (t->count * 2 >= t->cap && t->cap < SHARE_MAX_SLOTS) {
        Py_ssize_t ncap = t->cap ? t->cap * 2 : 1024;
        if (s->used + (size_t)ncap * sizeof(Shared) > s->budget) return -1;
        Shared *ns = PyMem_Calloc((size_t)ncap, sizeof(Shared));
        if (!ns) return -1;
        for (Py_ssize_t i = 0; i < t->cap; i++) {
            if (!t->slots[i].len) continue;
            Py_ssize_t j = (Py_ssize_t)(t->slots[i].h & (uint64_t)(ncap - 1));
            while (ns[j].len) j = (j + 1) & (ncap - 1);
            ns[j] = t->slots[i];
        }
        s->used += (size_t)(ncap - t->cap) * sizeof(Shared);
        PyMem_Free(t->slots);
        t->slots = ns;
        t->cap = ncap;
    }
    const uint8_t *p = s->d + off;
    uint64_t h = str_hash(p, len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->cap - 1));
    for (int probes = 0; t->slots[j].len; probes++) {
        Shared *sl = &t->slots[j];
        if (sl->h == h && sl->len == len && !memcmp(s->d + sl->off, p, (size_t)len)) return sl->off;
        /* The hash is not keyed: strings crafted to collide would make each lookup walk one growing cluster
         * (quadratic). Sharing only saves work later; such a string keeps its own offset. */
        if (probes >= SHARE_MAX_PROBE) return off;
        j = (j + 1) & (t->cap - 1);
    }
    if (t->count * 4 < t->cap * 3) { /* a full table (at its cap) only looks up */
        t->slots[j] = (Shared){h, off, len};
        t->count++;
    }
    return off;
}

/* Bytes that end the plain run of a string: the quote, the backslash, control characters, non-ASCII. */
static uint8_t SPECIAL[256];
static int special_ready;

static void special_init(void) {
    for (int c = 0; c < 256; c++) SPECIAL[c] = (uint8_t)(c < 0x20 || c == '"' || c == '\\' || c >= 0x80);
    special_ready = 1;
}

/* The length of one valid UTF-8 sequence at p (strict: no overlong forms, no surrogates, at most U+10FFFF),
 * 0 when there is none. `avail` bytes may be read. */
static inline int utf8_seq(const uint8_t *p, Py_ssize_t avail) {
    uint8_t c0 = p[0];
    if (c0 < 0xC2 || c0 > 0xF4) return 0;
    if (c0 < 0xE0) return avail >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c0 < 0xF0) {
        if (avail < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if ((c0 == 0xE0 && p[1] < 0xA0) || (c0 == 0xED && p[1] >= 0xA0)) return 0;
        return 3;
    }
    if (avail < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
    if ((c0 == 0xF0 && p[1] < 0x90) || (c0 == 0xF4 && p[1] >= 0x90)) return 0;
    return 4;
}

static inline int hex4(const uint8_t *p) {
    int x = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        x = x * 16 + d;
    }
    return x;
}

/* The string whose opening quote is at in[*pos - 1]: its (offset, length) in s->d once decoded; *pos past the
 * closing quote. -1: decline. */
static int json_string(Scan *s, const uint8_t *in, Py_ssize_t *pos, int *copied, Val *out) {
    Py_ssize_t n = s->n, p = *pos, start = p;
    for (;;) {
        while (p < n && !SPECIAL[in[p]]) p++;
        if (p >= n) return -1;
        uint8_t c = in[p];
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c >= 0x80) {
            int k = utf8_seq(in + p, n - p);
            if (!k) return -1;
            p += k;
            continue;
        }
        goto escaped; /* a backslash */
    }
    if (p - start > 0x7fffffff) return -1;
    *out = (Val){K_STR, (uint32_t)(p - start), start};
    *pos = p + 1;
    return 0;

escaped:
    if (!*copied) { /* the first escape of the text: from here on strings are read from a decoded copy */
        if (GROW(s, s->pool, s->pool_cap, n)) return -1;
        memcpy(s->pool, in, (size_t)n);
        s->d = s->pool;
        *copied = 1;
    }
    {
        uint8_t *w = s->pool + p; /* the write position: never past the read position p */
        for (;;) {
            if (p >= n) return -1;
            uint8_t c = in[p];
            if (!SPECIAL[c]) { *w++ = c; p++; continue; }
            if (c == '"') break;
            if (c < 0x20) return -1;
            if (c >= 0x80) {
                int k = utf8_seq(in + p, n - p);
                if (!k) return -1;
                memmove(w, in + p, (size_t)k);
                w += k;
                p += k;
                continue;
            }
            if (p + 1 >= n) return -1;
            uint8_t e = in[p + 1];
            uint8_t simple = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b' : e == 'f' ? '\f'
                           : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
            if (simple) { *w++ = simple; p += 2; continue; }
            if (e != 'u' || n - p < 6) return -1;
            int32_t cp = hex4(in + p + 2);
            if (cp < 0) return -1;
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate: only with a low one after it */
                if (n - p < 6 || in[p] != '\\' || in[p + 1] != 'u') return -1;
                int32_t lo = hex4(in + p + 2);
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return -1; /* a lone low surrogate: Python keeps it, a str UTF-8 cannot carry: declined */
            }
            if (cp < 0x80) *w++ = (uint8_t)cp;
            else if (cp < 0x800) { *w++ = (uint8_t)(0xC0 | cp >> 6); *w++ = (uint8_t)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *w++ = (uint8_t)(0xE0 | cp >> 12); *w++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (uint8_t)(0x80 | (cp & 0x3F));
            } else {
                *w++ = (uint8_t)(0xF0 | cp >> 18); *w++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                *w++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); *w++ = (uint8_t)(0x80 | (cp & 0x3F));
            }
        }
        Py_ssize_t len = (Py_ssize_t)(w - (s->pool + start));
        if (len > 0x7fffffff) return -1;
        *out = (Val){K_STR, (uint32_t)len, start};
        *pos = p + 1;
        return 0;
    }
}

/* A number at in[*pos]: an int within int64 (K_INT) or a float (K_FLOAT, its bits); -1: decline. */
static int json_number(const uint8_t *in, Py_ssize_t n, Py_ssize_t *pos, Val *out) {
    Py_ssize_t p = *pos, start = p;
    int neg = 0, is_float = 0;
    if (in[p] == '-') { neg = 1; p++; }
    if (p >= n) return -1;
    uint64_t mag = 0;
    int digits = 0;
    if (in[p] == '0') { p++; digits = 1; }
    else if (in[p] >= '1' && in[p] <= '9') {
        while (p < n && in[p] >= '0' && in[p] <= '9') {
            if (digits < 19) mag = mag * 10 + (uint64_t)(in[p] - '0');
            if (digits < 20) digits++; /* 20: more than int64 holds (an int count would overflow at 2**31) */
            p++;
        }
    } else return -1;
    if (p < n && in[p] == '.') {
        p++;
        if (p >= n || in[p] < '0' || in[p] > '9') return -1;
        while (p < n && in[p] >= '0' && in[p] <= '9') p++;
        is_float = 1;
    }
    if (p < n && (in[p] == 'e' || in[p] == 'E')) {
        p++;
        if (p < n && (in[p] == '+' || in[p] == '-')) p++;
        if (p >= n || in[p] < '0' || in[p] > '9') return -1;
        while (p < n && in[p] >= '0' && in[p] <= '9') p++;
        is_float = 1;
    }
    *pos = p;
    if (!is_float) {
        if (digits > 19 || mag > (uint64_t)INT64_MAX + (uint64_t)neg) return -1; /* past int64: declined */
        *out = (Val){K_INT, 0, neg ? (int64_t)(0 - mag) : (int64_t)mag};
        return 0;
    }
    Py_ssize_t len = p - start;
    if (len > FLOAT_MAX) return -1;
    char buf[FLOAT_MAX + 1];
    memcpy(buf, in + start, (size_t)len);
    buf[len] = 0;
    char *end = NULL;
    double x = PyOS_string_to_double(buf, &end, NULL); /* as float(): overflow gives +-inf */
    if (PyErr_Occurred() || end != buf + len) { PyErr_Clear(); return -1; }
    uint64_t u;
    memcpy(&u, &x, 8);
    *out = (Val){K_FLOAT, 0, (int64_t)u};
    return 0;
}

static inline Py_ssize_t skip_ws(const uint8_t *in, Py_ssize_t n, Py_ssize_t p) {
    while (p < n && (in[p] == ' ' || in[p] == '\n' || in[p] == '\r' || in[p] == '\t')) p++;
    return p;
}

/* Close the innermost container: its values (from its mark on the stack) become its node's one chunk. */
static inline int close_container(Scan *s) {
    Py_ssize_t m = s->marks[--s->nm];
    if (add_chunk(s, s->stack[m - 1].v, s->stack + m, s->sp - m)) return -1;
    s->sp = m;
    return 0;
}

int frscan_parse_json(Scan *s) {
    if (!special_ready) special_init();
    const uint8_t *in = s->d;
    Py_ssize_t n = s->n, p = 0;
    int copied = 0, depth = 0, rc = -1;
    uint8_t in_object[MAX_JSON_DEPTH + 1]; /* per open container: 1 object, 0 array */
    Py_ssize_t span_at[MAX_JSON_DEPTH + 1]; /* per open container within span_depth: its span's index */
    ShareTable shared = {0};
    Val v;

value:
    p = skip_ws(in, n, p);
    if (p >= n) goto out;
    switch (in[p]) {
    case '{': case '[': {
        int obj = in[p] == '{';
        if (depth >= MAX_JSON_DEPTH) goto out;
        if (new_node(s, obj ? K_DICT : K_LIST, &v) || push(s, v)) goto out;
        if (GROW(s, s->marks, s->mcap, s->nm + 1)) goto out;
        s->marks[s->nm++] = s->sp;
        in_object[++depth] = (uint8_t)obj;
        if (depth <= s->span_depth) {
            if (GROW(s, s->spans, s->spans_cap, 3 * (s->nspans + 1))) goto out;
            int64_t *sp = s->spans + 3 * s->nspans;
            sp[0] = v.v; sp[1] = p; sp[2] = -1;
            span_at[depth] = s->nspans++;
        }
        p = skip_ws(in, n, p + 1);
        if (p >= n) goto out;
        if (in[p] == (obj ? '}' : ']')) {
            if (depth <= s->span_depth) s->spans[3 * span_at[depth] + 2] = p + 1;
            if (close_container(s)) goto out;
            depth--;
            p++;
            goto after_value;
        }
        if (obj) goto key;
        goto value;
    }
    case '"':
        p++;
        if (json_string(s, in, &p, &copied, &v)) goto out;
        if ((v.v = share(s, &shared, v.v, v.len)) < 0 || push(s, v)) goto out;
        goto after_value;
    case 't':
        if (n - p < 4 || memcmp(in + p, "true", 4)) goto out;
        p += 4;
        if (push(s, (Val){K_TRUE, 0, 0})) goto out;
        goto after_value;
    case 'f':
        if (n - p < 5 || memcmp(in + p, "false", 5)) goto out;
        p += 5;
        if (push(s, (Val){K_FALSE, 0, 0})) goto out;
        goto after_value;
    case 'n':
        if (n - p < 4 || memcmp(in + p, "null", 4)) goto out;
        p += 4;
        if (push(s, (Val){K_NONE, 0, 0})) goto out;
        goto after_value;
    default:
        if (in[p] != '-' && (in[p] < '0' || in[p] > '9')) goto out; /* NaN, Infinity, anything else */
        if (json_number(in, n, &p, &v) || push(s, v)) goto out;
        goto after_value;
    }

key: /* p at an object's key (after '{' or ',' and whitespace) */
    if (p >= n || in[p] != '"') goto out;
    p++;
    if (json_string(s, in, &p, &copied, &v)) goto out;
    if ((v.v = share(s, &shared, v.v, v.len)) < 0 || push(s, v)) goto out;
    p = skip_ws(in, n, p);
    if (p >= n || in[p] != ':') goto out;
    p++;
    goto value;

after_value:
    if (depth == 0) {
        if (!s->prefix) p = skip_ws(in, n, p);
        if ((!s->prefix && p != n) || s->sp != 1 || s->nm != 0) goto out;
        s->end = p;
        s->result = s->stack[0];
        rc = 0;
        goto out;
    }
    p = skip_ws(in, n, p);
    if (p >= n) goto out;
    if (in[p] == ',') {
        p = skip_ws(in, n, p + 1);
        if (in_object[depth]) goto key;
        goto value;
    }
    if (in[p] != (in_object[depth] ? '}' : ']')) goto out;
    if (depth <= s->span_depth) s->spans[3 * span_at[depth] + 2] = p + 1;
    if (close_container(s)) goto out;
    depth--;
    p++;
    goto after_value;

out:
    PyMem_Free(shared.slots);
    return rc;
}

/* --- a sidecar's snapshot envelope: its pieces, each through `extract` ------------------------------ */

/* The byte span [start, end) of container `node`, recorded by the JSON parser (spans are in node order). */
static int span_of(const Scan *s, int64_t node, int64_t *start, int64_t *end) {
    Py_ssize_t lo = 0, hi = s->nspans;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (s->spans[3 * mid] < node) lo = mid + 1; else hi = mid;
    }
    if (lo >= s->nspans || s->spans[3 * lo] != node || s->spans[3 * lo + 2] < 0) return -1;
    *start = s->spans[3 * lo + 1];
    *end = s->spans[3 * lo + 2];
    return 0;
}

/* A snapshot envelope's pieces, each through `extract` on the one parse of the body. */
static PyObject *envelope(Scan *s, Py_ssize_t last, Py_ssize_t max_pieces) {
    Val top = s->result;
    if (top.kind != K_DICT) return NULL;
    const Val *ranks = NULL, *key = NULL;
    EACH_CHILD(s, top.v, c, {
        if (!key) { key = c; continue; }
        if (is_key(s, key, "ranks", 5)) ranks = c; /* a repeated key: the last one wins, as in a dict */
        key = NULL;
    });
    int64_t rs, re, ps, pe;
    if (!ranks || ranks->kind != K_LIST || s->nodes[ranks->v].count > max_pieces || span_of(s, ranks->v, &rs, &re))
        return NULL;
    Py_ssize_t old_ocap = s->ocap;
    if (GROW(s, s->node_obj, s->ocap, s->nn + 1)) return NULL;
    memset(s->node_obj + old_ocap, 0, (size_t)(s->ocap - old_ocap) * sizeof(PyObject *));
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    EACH_CHILD(s, ranks->v, c, {
        if ((c->kind != K_DICT && c->kind != K_LIST) || span_of(s, c->v, &ps, &pe)) { Py_DECREF(list); return NULL; }
        PyObject *got = NULL;
        if (c->kind == K_DICT) {
            s->result = *c;
            got = frscan_extract(s, 1, last);
            if (!got) PyErr_Clear(); /* this piece declined: the caller decodes its span the reference way */
        }
        PyObject *item = Py_BuildValue("(LLN)", (long long)ps, (long long)pe, got ? got : Py_NewRef(Py_None));
        if (!item || PyList_Append(list, item)) { Py_XDECREF(item); Py_DECREF(list); return NULL; }
        Py_DECREF(item);
    });
    return Py_BuildValue("(LLN)", (long long)rs, (long long)re, list);
}

PyObject *frscan_scan_envelope(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t budget, last, max_pieces;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &budget, &last, &max_pieces)) return NULL;
    Scan s;
    int taken = frscan_begin(&s, &view, budget);
    s.span_depth = 3; /* the envelope, its "ranks" (and other fields), the pieces */
    PyObject *out = NULL;
    if (frscan_parse_json(&s) == 0) out = envelope(&s, last, max_pieces);
    frscan_end(&s, taken);
    PyBuffer_Release(&view);
    if (!out) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return out;
}
