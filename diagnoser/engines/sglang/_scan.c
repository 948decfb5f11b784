/* Compiled line scanner for the bulk log backfill (diagnoser/engines/sglang/logfast.py).

   scan(block) reads a block of log lines (separated by '\n', no final newline) and takes the lines
   whose shape it knows for certain: a "[date time(.ms)( tags)] " prefix (optionally behind a
   docker-compose or Ray prefix) followed by a "Decode batch" line, a "Prefill batch" line or a uvicorn
   access line -- exactly the lines logfast.BLOCK_RE takes through its bulk alternatives, with the same
   fields. Every other line, and every line whose numbers it cannot convert exactly (more than 15
   digits), is returned untouched in a residual block for the Python path (BLOCK_RE), so the result
   of the pair is the regex's result.

   Why hand-written C: Python's regex alone costs more per line than the 1 M lines/s budget
   allows on two cores (bench/bench_log_backfill.py); the regex path stays the reference in the tests
   (tests/test_log_scan.py compares both on real and generated logs, line by line).

   Numbers: an integer of <= 15 digits is exact in a double; a decimal "I.F" with <= 15 digits in all
   is (double)IF / 10^len(F), one correctly rounded IEEE division of two exact doubles, which is the
   correctly rounded value of the decimal -- what Python's float() returns.

   No numpy at build time: columns are returned as bytes objects that logfast views with numpy.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NV 10              /* value slots per line (decode uses 10, prefill 9) */
#define MAX_TAGS 256       /* distinct rank-tag texts per block */
#define PATH_CAP (1 << 16) /* distinct "METHOD PATH" texts per block (hash table size) */

enum { K_OTHER = 0, K_DECODE = 1, K_PREFILL = 2, K_ACCESS = 3 };

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8,
                               1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};

typedef struct {
    const unsigned char *p; /* cursor */
    const unsigned char *e; /* end of line */
} Cur;

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline int is_word(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static inline int lit(Cur *c, const char *s, size_t n) {
    if ((size_t)(c->e - c->p) < n || memcmp(c->p, s, n) != 0) return 0;
    c->p += n;
    return 1;
}
#define LIT(c, s) lit((c), (s), sizeof(s) - 1)

/* maximal digit run; its length, or -1 when outside [lo, hi] */
static inline int digits(Cur *c, int lo, int hi, int64_t *out) {
    const unsigned char *s = c->p;
    int64_t v = 0;
    while (c->p < c->e && is_digit(*c->p)) {
        if (c->p - s < 18) v = v * 10 + (*c->p - '0');
        c->p++;
    }
    int n = (int)(c->p - s);
    if (n < lo || n > hi) return -1;
    if (out) *out = v;
    return n;
}

/* N = \d{1,30}; exact only up to 15 digits: returns 0 = no match, 1 = ok, 2 = matches but too long */
static inline int num_n(Cur *c, double *out) {
    int64_t v;
    int n = digits(c, 1, 30, &v);
    if (n < 0) return 0;
    if (n > 15) return 2;
    *out = (double)v;
    return 1;
}

/* F = \d{1,30}\.\d{1,30} */
static inline int num_f(Cur *c, double *out) {
    int64_t a, b;
    int n = digits(c, 1, 30, &a);
    if (n < 0) return 0;
    if (c->p >= c->e || *c->p != '.') return 0;
    c->p++;
    int m = digits(c, 1, 30, &b);
    if (m < 0) return 0;
    if (n + m > 15) return 2;
    int64_t mant = a;
    for (int i = 0; i < m; i++) mant *= 10;
    *out = (double)(mant + b) / POW10[m];
    return 1;
}

static inline int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

/* logformats.epoch_day (days_from_civil) with Python's floor division */
static int64_t epoch_day(int64_t y, int64_t m, int64_t d) {
    y -= (m <= 2);
    int64_t era = floordiv(y >= 0 ? y : y - 399, 400);
    int64_t yoe = y - era * 400;
    int64_t doy = floordiv(153 * (m + (m > 2 ? -3 : 9)) + 2, 5) + d - 1;
    int64_t doe = yoe * 365 + floordiv(yoe, 4) - floordiv(yoe, 100) + doy;
    return (era * 146097 + doe - 719468) * 86400;
}

/* logformats.date_ok and time_ok: a real UTC time in 1970..9998, else the line is left to the reference
   parser (which counts it as an error) */
static int stamp_ok(int64_t y, int64_t mo, int64_t d, int64_t h, int64_t mi, int64_t s) {
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1970 || y > 9998 || mo < 1 || mo > 12 || d < 1) return 0;
    int leap = mo == 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    if (d > mdays[mo - 1] + leap) return 0;
    return h < 24 && mi < 60 && s < 60;
}

static inline int dd(const unsigned char *p, int n, int64_t *v) {
    int64_t x = 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit(p[i])) return 0;
        x = x * 10 + (p[i] - '0');
    }
    *v = x;
    return 1;
}

typedef struct {
    /* interned byte strings: rank tags and access "METHOD PATH" */
    const unsigned char *tag_p[MAX_TAGS];
    Py_ssize_t tag_n[MAX_TAGS];
    int ntags;
    int32_t *slot;      /* PATH_CAP hash slots: index into paths, or -1 */
    const unsigned char **path_p;
    Py_ssize_t *path_n;
    int npaths;
} Intern;

static int intern_tag(Intern *in, const unsigned char *p, Py_ssize_t n) {
    for (int i = 0; i < in->ntags; i++)
        if (in->tag_n[i] == n && memcmp(in->tag_p[i], p, (size_t)n) == 0) return i;
    if (in->ntags >= MAX_TAGS) return -1;
    in->tag_p[in->ntags] = p;
    in->tag_n[in->ntags] = n;
    return in->ntags++;
}

static int intern_path(Intern *in, const unsigned char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    uint32_t k = (uint32_t)(h ^ (h >> 32)) & (PATH_CAP - 1);
    for (;;) {
        int32_t s = in->slot[k];
        if (s < 0) break;
        if (in->path_n[s] == n && memcmp(in->path_p[s], p, (size_t)n) == 0) return s;
        k = (k + 1) & (PATH_CAP - 1);
    }
    if (in->npaths >= PATH_CAP / 2) return -1; /* keep the table sparse; the line goes to Python */
    in->slot[k] = in->npaths;
    in->path_p[in->npaths] = p;
    in->path_n[in->npaths] = n;
    return in->npaths++;
}

typedef struct {
    int kind;
    uint16_t bits;
    int tag;
    double ts;
    double v[NV];
    int status;
    int path;
} Row;

/* bits: hdr (0 ". ", 1 ", ", 2 " [N], ") | trail (0 "", 1 ",", 2 ", ") << 2 | graph label
   (0 none, 1 cuda, 2 cpu, 3 npu) << 4 | optional fields present << 6.. | stamp has a fraction << 9 |
   hybrid SWA decode line << 10 */
#define B_FRAC (1u << 9)

static int graph_label(Cur *c) {
    if (LIT(c, "cuda graph: ")) return 1;
    if (LIT(c, "cpu graph: ")) return 2;
    if (LIT(c, "npu graph: ")) return 3;
    return 0;
}

static int header(Cur *c, const char *word, size_t wn, Row *r) {
    if (!lit(c, word, wn)) return 0;
    if (LIT(c, ". ")) r->bits |= 0;
    else if (LIT(c, ", ")) r->bits |= 1;
    else if (LIT(c, " [")) {
        if (digits(c, 1, 30, NULL) < 0) return 0;
        if (!LIT(c, "], ")) return 0;
        r->bits |= 2;
    } else return 0;
    return 1;
}

/* the trailing "(, |,|)" and the end of the line */
static int trail(Cur *c, Row *r) {
    if (c->p == c->e) return 1;
    if (LIT(c, ", ")) r->bits |= 2u << 2;
    else if (LIT(c, ",")) r->bits |= 1u << 2;
    else return 0;
    return c->p == c->e;
}

#define NUM(kind_fn, c, dst)             \
    do {                                 \
        int _k = kind_fn((c), (dst));    \
        if (_k != 1) return 0;           \
    } while (0)

static int decode(Cur *c, Row *r) {
    if (!header(c, "Decode batch", 12, r)) return 0;
    double *v = r->v;
    for (int i = 0; i < NV; i++) v[i] = 0.0;
    if (!LIT(c, "#running-req: ")) return 0;
    NUM(num_n, c, &v[0]);
    if (LIT(c, ", #token: ")) {
        NUM(num_n, c, &v[1]);
        if (!LIT(c, ", token usage: ")) return 0;
        NUM(num_f, c, &v[2]);
    } else if (LIT(c, ", #full token: ")) { /* hybrid SWA: token usage is the larger pool's */
        NUM(num_n, c, &v[1]);
        if (!LIT(c, ", full token usage: ")) return 0;
        NUM(num_f, c, &v[8]);
        if (!LIT(c, ", #swa token: ")) return 0;
        if (digits(c, 1, 30, NULL) < 0) return 0;
        if (!LIT(c, ", swa token usage: ")) return 0;
        NUM(num_f, c, &v[9]);
        v[2] = v[9] > v[8] ? v[9] : v[8];
        r->bits |= 1u << 10;
    } else return 0;
    if (!LIT(c, ", ")) return 0;
    if (LIT(c, "accept len: ")) {
        NUM(num_f, c, &v[3]);
        if (!LIT(c, ", ")) return 0;
        r->bits |= 1u << 6;
    }
    if (LIT(c, "accept rate: ")) {
        NUM(num_f, c, &v[4]);
        if (!LIT(c, ", ")) return 0;
        r->bits |= 1u << 7;
    }
    int g = graph_label(c);
    if (g) {
        if (LIT(c, "True")) v[5] = 1.0;
        else if (LIT(c, "False")) v[5] = 0.0;
        else return 0;
        if (!LIT(c, ", ")) return 0;
        r->bits |= (uint16_t)(g << 4);
    }
    if (!LIT(c, "gen throughput (token/s): ")) return 0;
    NUM(num_f, c, &v[6]);
    if (!LIT(c, ", #queue-req: ")) return 0;
    NUM(num_n, c, &v[7]);
    if (!trail(c, r)) return 0;
    r->kind = K_DECODE;
    return 1;
}

static int prefill(Cur *c, Row *r) {
    if (!header(c, "Prefill batch", 13, r)) return 0;
    double *v = r->v;
    for (int i = 0; i < NV; i++) v[i] = 0.0;
    if (!LIT(c, "#new-seq: ")) return 0;
    NUM(num_n, c, &v[0]);
    if (!LIT(c, ", #new-token: ")) return 0;
    NUM(num_n, c, &v[1]);
    if (!LIT(c, ", #cached-token: ")) return 0;
    NUM(num_n, c, &v[2]);
    if (!LIT(c, ", ")) return 0;
    if (LIT(c, "cache hit rate: ")) {
        NUM(num_f, c, &v[3]);
        if (!LIT(c, "%, ")) return 0;
        r->bits |= 1u << 6;
    }
    if (!LIT(c, "token usage: ")) return 0;
    NUM(num_f, c, &v[4]);
    if (!LIT(c, ", #running-req: ")) return 0;
    NUM(num_n, c, &v[5]);
    if (!LIT(c, ", #queue-req: ")) return 0;
    NUM(num_n, c, &v[6]);
    if (LIT(c, ", #pending-token: ")) {
        NUM(num_n, c, &v[7]);
        r->bits |= 1u << 7;
    }
    {
        Cur save = *c;
        if (LIT(c, ", ")) {
            int g = graph_label(c);
            if (g && (LIT(c, "True") || LIT(c, "False"))) r->bits |= (uint16_t)(g << 4);
            else *c = save;
        }
    }
    if (LIT(c, ", input throughput (token/s): ")) {
        NUM(num_f, c, &v[8]);
        r->bits |= 1u << 8;
    }
    if (!trail(c, r)) return 0;
    r->kind = K_PREFILL;
    return 1;
}

static const unsigned char *find2(const unsigned char *p, const unsigned char *e, const char *s, size_t n) {
    while ((size_t)(e - p) >= n) {
        const unsigned char *q = memchr(p, s[0], (size_t)(e - p - (Py_ssize_t)n + 1));
        if (!q) return NULL;
        if (memcmp(q, s, n) == 0) return q;
        p = q + 1;
    }
    return NULL;
}

static int access_line(Cur *c, Row *r, Intern *in) {
    if (!LIT(c, "INFO:")) return 0;
    const unsigned char *s = c->p;
    while (c->p < c->e && *c->p == ' ') c->p++;
    if (c->p - s < 1 || c->p - s > 50) return 0;
    /* [\w.:\[\]-]{1,200}:\d{1,9} - "   (the split is at the token's last ':') */
    s = c->p;
    while (c->p < c->e) {
        unsigned char ch = *c->p;
        if (is_word(ch) || ch == '.' || ch == ':' || ch == '[' || ch == ']' || ch == '-') c->p++;
        else break;
    }
    const unsigned char *tok_end = c->p, *colon = NULL;
    for (const unsigned char *q = tok_end; q > s; q--)
        if (q[-1] == ':') { colon = q - 1; break; }
    if (!colon) return 0;
    Py_ssize_t host = colon - s, port = tok_end - colon - 1;
    if (host < 1 || host > 200 || port < 1 || port > 9) return 0;
    for (const unsigned char *q = colon + 1; q < tok_end; q++)
        if (!is_digit(*q)) return 0;
    if (!LIT(c, " - \"")) return 0;
    const unsigned char *mp = c->p;
    while (c->p < c->e && *c->p >= 'A' && *c->p <= 'Z') c->p++;
    if (c->p - mp < 1 || c->p - mp > 20) return 0;
    if (!LIT(c, " ")) return 0;
    const unsigned char *pp = c->p;
    while (c->p < c->e && *c->p >= '!' && *c->p <= '~') c->p++;
    Py_ssize_t plen = c->p - pp;
    if (plen < 1 || plen > 8000) return 0;
    const unsigned char *path_end = c->p;
    if (!LIT(c, " HTTP/")) return 0;
    const unsigned char *vs = c->p;
    while (c->p < c->e && (is_digit(*c->p) || *c->p == '.')) c->p++;
    if (c->p - vs < 1 || c->p - vs > 10) return 0;
    if (!LIT(c, "\" ")) return 0;
    if (c->e - c->p < 3 || !is_digit(c->p[0]) || !is_digit(c->p[1]) || !is_digit(c->p[2])) return 0;
    int status = (c->p[0] - '0') * 100 + (c->p[1] - '0') * 10 + (c->p[2] - '0');
    c->p += 3;
    if (c->p < c->e) {
        if (*c->p != ' ') return 0;
        c->p++;
        if (c->e - c->p > 400) return 0;
        for (const unsigned char *q = c->p; q < c->e; q++)
            if (*q < ' ' || *q > '~') return 0;
        if (find2(c->p, c->e, "Prefill batch", 13) || find2(c->p, c->e, "Decode batch", 12)) return 0;
        c->p = c->e;
    }
    int id = intern_path(in, mp, path_end - mp);
    if (id < 0) return 0;
    r->kind = K_ACCESS;
    r->status = status;
    r->path = id;
    return 1;
}

/* the whole line; 1 when taken (r filled), 0 when it goes to the Python path */
static int line(const unsigned char *p, const unsigned char *e, Row *r, Intern *in) {
    Cur c = {p, e};
    r->kind = K_OTHER;
    r->bits = 0;
    /* docker compose "name  | " */
    if (c.p < c.e && (is_word(*c.p) || *c.p == '.' || *c.p == '-')) {
        const unsigned char *s = c.p;
        while (c.p < c.e && (is_word(*c.p) || *c.p == '.' || *c.p == '-')) c.p++;
        if (c.p - s > 200) return 0;
        s = c.p;
        while (c.p < c.e && (*c.p == ' ' || *c.p == '\t')) c.p++;
        if (c.p - s < 1 || c.p - s > 50) return 0;
        if (!LIT(&c, "|")) return 0;
        if (c.p < c.e && (*c.p == ' ' || *c.p == '\t')) c.p++;
        else return 0;
    }
    /* Ray "(SGLangEngine pid=N(, ip=...)) " */
    if (c.p < c.e && *c.p == '(') {
        if (!LIT(&c, "(SGLangEngine pid=")) return 0;
        if (digits(&c, 1, 20, NULL) < 0) return 0;
        if (LIT(&c, ", ip=")) {
            const unsigned char *s = c.p;
            while (c.p < c.e && *c.p != ')' && *c.p != '\n') c.p++;
            if (c.p - s > 200) return 0;
        }
        if (!LIT(&c, ")")) return 0;
        const unsigned char *s = c.p;
        while (c.p < c.e && (*c.p == ' ' || *c.p == '\t')) c.p++;
        if (c.p - s < 1 || c.p - s > 50) return 0;
    }
    /* [YYYY-MM-DD HH:MM:SS(.ffffff)( TAGn)*] */
    if (c.e - c.p < 22 || *c.p != '[') return 0;
    const unsigned char *t = c.p + 1;
    int64_t y, mo, d, h, mi, s;
    if (!dd(t, 4, &y) || t[4] != '-' || !dd(t + 5, 2, &mo) || t[7] != '-' || !dd(t + 8, 2, &d) || t[10] != ' ' ||
        !dd(t + 11, 2, &h) || t[13] != ':' || !dd(t + 14, 2, &mi) || t[16] != ':' || !dd(t + 17, 2, &s) ||
        !stamp_ok(y, mo, d, h, mi, s))
        return 0;
    c.p = t + 19;
    double frac = 0.0;
    if (c.p < c.e && (*c.p == '.' || *c.p == ',')) {
        c.p++;
        int64_t f;
        int n = digits(&c, 1, 6, &f);
        if (n < 0) return 0;
        frac = (double)f / POW10[n];
        r->bits |= B_FRAC;
    }
    const unsigned char *tags = c.p;
    int ntag = 0;
    while (c.p < c.e && *c.p == ' ') {
        c.p++;
        if (!(LIT(&c, "DP") || LIT(&c, "PP") || LIT(&c, "TP") || LIT(&c, "EP") || LIT(&c, "ATTN_CP") ||
              LIT(&c, "MOE_DP") || LIT(&c, "CP")))
            return 0;
        if (digits(&c, 1, 9, NULL) < 0) return 0;
        if (++ntag > 8) return 0;
    }
    const unsigned char *tags_end = c.p;
    if (!LIT(&c, "] ")) return 0;
    r->ts = (double)(epoch_day(y, mo, d) + h * 3600 + mi * 60 + s) + frac;
    int ok;
    if (c.p < c.e && *c.p == 'D') ok = decode(&c, r);
    else if (c.p < c.e && *c.p == 'P') ok = prefill(&c, r);
    else if (c.p < c.e && *c.p == 'I') ok = access_line(&c, r, in);
    else ok = 0;
    if (!ok) return 0;
    r->tag = intern_tag(in, tags, tags_end - tags);
    return r->tag >= 0;
}

static PyObject *new_bytes(Py_ssize_t n, char **buf) {
    PyObject *o = PyBytes_FromStringAndSize(NULL, n);
    if (o) *buf = PyBytes_AS_STRING(o);
    return o;
}

PyDoc_STRVAR(scan_doc,
"scan(block, triggers) -> (n, kind, bits, tag, ts, vals, status, path, tags, paths, residual_rows, residual, refs)\n\n"
"Per line: kind uint8 (0 other, 1 decode, 2 prefill, 3 access), bits uint16, tag int16, ts float64,\n"
"vals float64[10], status int16, path int32 (bytes objects); tags and paths: the interned texts;\n"
"residual_rows int32 and residual: the lines not taken that the bulk regex might take, joined by\n"
"newlines; refs: (row, line) of the other lines the reference parser must see (trigger words,\n"
"non-ASCII or NUL bytes, over-long); the remaining lines are only counted.");

/* a line the bulk regex cannot take: 1 when it may still be a bulk line by the regex (its message
   starts right after "] " with one of the bulk words; any prefix), 2 when it is surely another line
   that the reference parser must see (a trigger word, a byte outside ASCII or NUL, or too long; the
   same test as logfast.BlockParser.parse_re), 0 when it is only counted */
static int classify(const unsigned char *p, const unsigned char *e, const unsigned char **trig, const Py_ssize_t *trig_n,
                    Py_ssize_t ntrig) {
    if (find2(p, e, "] Decode batch", 14) || find2(p, e, "] Prefill batch", 15) || find2(p, e, "] INFO:", 7)) return 1;
    if (e - p >= 65535) return 2;
    for (const unsigned char *q = p; q < e; q++)
        if (*q == 0 || *q >= 0x80) return 2;
    for (Py_ssize_t k = 0; k < ntrig; k++)
        if (find2(p, e, (const char *)trig[k], (size_t)trig_n[k])) return 2;
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *triggers;
    if (!PyArg_ParseTuple(args, "y*O!", &view, &PyTuple_Type, &triggers)) return NULL;
    Py_ssize_t ntrig = PyTuple_GET_SIZE(triggers);
    const unsigned char *trig[64];
    Py_ssize_t trig_n[64];
    if (ntrig > 64) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "at most 64 trigger words");
    }
    for (Py_ssize_t k = 0; k < ntrig; k++) {
        PyObject *t = PyTuple_GET_ITEM(triggers, k);
        if (!PyBytes_Check(t) || PyBytes_GET_SIZE(t) < 1) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_TypeError, "trigger words must be non-empty bytes");
        }
        trig[k] = (const unsigned char *)PyBytes_AS_STRING(t);
        trig_n[k] = PyBytes_GET_SIZE(t);
    }
    const unsigned char *b = view.buf, *end = b + view.len;
    Py_ssize_t n = 1;
    for (const unsigned char *q = b; (q = memchr(q, '\n', (size_t)(end - q))) != NULL; q++) n++;

    char *kind, *bits, *tag, *ts, *vals, *status, *path, *rrows, *res;
    PyObject *o_kind = new_bytes(n, &kind), *o_bits = new_bytes(2 * n, &bits), *o_tag = new_bytes(2 * n, &tag),
             *o_ts = new_bytes(8 * n, &ts), *o_vals = new_bytes(8 * NV * n, &vals),
             *o_status = new_bytes(2 * n, &status), *o_path = new_bytes(4 * n, &path);
    Intern in;
    in.ntags = 0;
    in.npaths = 0;
    in.slot = PyMem_Malloc(sizeof(int32_t) * PATH_CAP);
    in.path_p = PyMem_Malloc(sizeof(unsigned char *) * PATH_CAP);
    in.path_n = PyMem_Malloc(sizeof(Py_ssize_t) * PATH_CAP);
    int32_t *rr = PyMem_Malloc(sizeof(int32_t) * (size_t)n);
    const unsigned char **rp = PyMem_Malloc(sizeof(unsigned char *) * (size_t)n);
    Py_ssize_t *rn = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);
    int32_t *fr = PyMem_Malloc(sizeof(int32_t) * (size_t)n); /* rows of the surely-other lines for the parser */
    PyObject *result = NULL;
    if (!o_kind || !o_bits || !o_tag || !o_ts || !o_vals || !o_status || !o_path || !in.slot || !in.path_p ||
        !in.path_n || !rr || !rp || !rn || !fr) {
        PyErr_NoMemory();
        goto done;
    }
    memset(in.slot, 0xff, sizeof(int32_t) * PATH_CAP);
    Py_ssize_t nres = 0, res_bytes = 0, nref = 0;
    {
        const unsigned char *p = b;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            const unsigned char *e = memchr(p, '\n', (size_t)(end - p));
            if (!e) e = end;
            Row r;
            r.ts = 0.0;
            r.status = 0;
            r.path = -1;
            r.tag = -1;
            double *vv = (double *)(vals + 8 * NV * i);
            if (line(p, e, &r, &in)) {
                memcpy(vv, r.v, sizeof(double) * NV);
                if (r.kind == K_ACCESS)
                    for (int k = 0; k < NV; k++) vv[k] = 0.0;
            } else {
                r.kind = K_OTHER;
                r.bits = 0;
                r.ts = 0.0;
                r.tag = -1;
                r.status = 0;
                r.path = -1;
                for (int k = 0; k < NV; k++) vv[k] = 0.0;
                int cls = classify(p, e, trig, trig_n, ntrig);
                if (cls == 1) {
                    rr[nres] = (int32_t)i;
                    rp[nres] = p;
                    rn[nres] = e - p;
                    res_bytes += (e - p) + 1;
                    nres++;
                } else if (cls == 2) {
                    fr[nref++] = (int32_t)i;
                }
            }
            kind[i] = (char)r.kind;
            uint16_t bb = r.bits;
            int16_t tg = (int16_t)r.tag, st = (int16_t)r.status;
            int32_t pa = (int32_t)r.path;
            memcpy(bits + 2 * i, &bb, 2);
            memcpy(tag + 2 * i, &tg, 2);
            memcpy(ts + 8 * i, &r.ts, 8);
            memcpy(status + 2 * i, &st, 2);
            memcpy(path + 4 * i, &pa, 4);
            p = e + 1;
        }
        Py_END_ALLOW_THREADS
    }
    PyObject *o_rrows = new_bytes(4 * nres, &rrows);
    PyObject *o_res = new_bytes(nres ? res_bytes - 1 : 0, &res);
    PyObject *o_tags = PyList_New(in.ntags), *o_paths = PyList_New(in.npaths), *o_refs = PyList_New(nref);
    if (!o_rrows || !o_res || !o_tags || !o_paths || !o_refs) {
        Py_XDECREF(o_rrows);
        Py_XDECREF(o_res);
        Py_XDECREF(o_tags);
        Py_XDECREF(o_paths);
        Py_XDECREF(o_refs);
        goto done;
    }
    {
        /* (row, line) of each surely-other line the parser must see: find their starts again */
        const unsigned char *p = b;
        Py_ssize_t row = 0;
        for (Py_ssize_t k = 0; k < nref; k++) {
            while (row < fr[k]) {
                p = memchr(p, '\n', (size_t)(end - p)) + 1;
                row++;
            }
            const unsigned char *e = memchr(p, '\n', (size_t)(end - p));
            if (!e) e = end;
            PyObject *item = Py_BuildValue("(iy#)", (int)fr[k], (const char *)p, (Py_ssize_t)(e - p));
            if (!item) goto fail_lists;
            PyList_SET_ITEM(o_refs, k, item);
        }
    }
    memcpy(rrows, rr, 4 * (size_t)nres);
    {
        char *w = res;
        for (Py_ssize_t k = 0; k < nres; k++) {
            if (k) *w++ = '\n';
            memcpy(w, rp[k], (size_t)rn[k]);
            w += rn[k];
        }
    }
    for (int k = 0; k < in.ntags; k++) {
        PyObject *t = PyBytes_FromStringAndSize((const char *)in.tag_p[k], in.tag_n[k]);
        if (!t) goto fail_lists;
        PyList_SET_ITEM(o_tags, k, t);
    }
    for (int k = 0; k < in.npaths; k++) {
        PyObject *t = PyBytes_FromStringAndSize((const char *)in.path_p[k], in.path_n[k]);
        if (!t) goto fail_lists;
        PyList_SET_ITEM(o_paths, k, t);
    }
    result = Py_BuildValue("(nNNNNNNNNNNNN)", n, o_kind, o_bits, o_tag, o_ts, o_vals, o_status, o_path, o_tags,
                           o_paths, o_rrows, o_res, o_refs);
    o_kind = o_bits = o_tag = o_ts = o_vals = o_status = o_path = NULL; /* stolen by "N" */
    goto done;
fail_lists:
    Py_DECREF(o_refs);
    Py_DECREF(o_rrows);
    Py_DECREF(o_res);
    Py_DECREF(o_tags);
    Py_DECREF(o_paths);
done:
    Py_XDECREF(o_kind);
    Py_XDECREF(o_bits);
    Py_XDECREF(o_tag);
    Py_XDECREF(o_ts);
    Py_XDECREF(o_vals);
    Py_XDECREF(o_status);
    Py_XDECREF(o_path);
    PyMem_Free(in.slot);
    PyMem_Free(in.path_p);
    PyMem_Free(in.path_n);
    PyMem_Free(rr);
    PyMem_Free(rp);
    PyMem_Free(rn);
    PyMem_Free(fr);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {{"scan", scan, METH_VARARGS, scan_doc}, {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "Compiled line scanner for the bulk log backfill.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
