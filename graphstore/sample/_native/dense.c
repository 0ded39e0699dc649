/* DENSE multi-hop sampling over a CSC graph, the whole hop loop in one pass of C.
 *
 * Plain C99 with no Python or torch headers: the library is loaded with ctypes and works on
 * raw pointers of contiguous CPU tensors, so it builds without torch and runs with any torch.
 * graphstore/sample/_native/__init__.py is the only caller and states the contract; this file
 * trusts its argument checks (targets distinct and in range, workspace all -1) except for
 * what it can check for free: every graph index it follows and every workspace entry it reads
 * is range-checked, so a corrupted graph or a dirty workspace is an error code, not a crash.
 *
 * Two calls per batch, because output sizes are known only after sampling and the outputs
 * are torch tensors the caller allocates:
 *   gs_dense_sample  samples every hop into growable buffers held by a context (gs_ctx_new,
 *                    kept across batches) and reports the block sizes and the edge count;
 *   gs_dense_export  writes node_ids / nbrs / nbr_offsets / edge_ids in DENSE order into the
 *                    caller's arrays and resets the workspace entries the batch set;
 *   gs_dense_discard (instead of export, e.g. when the caller failed to allocate) resets.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define GS_EXPORT __declspec(dllexport)
#else
#define GS_EXPORT __attribute__((visibility("default")))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define GS_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 1)
#define GS_PREFETCH_W(p) __builtin_prefetch((const void *)(p), 1, 1)
#define GS_LIKELY(x) __builtin_expect(!!(x), 1)
#define GS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define GS_PREFETCH(p) ((void)0)
#define GS_PREFETCH_W(p) ((void)0)
#define GS_LIKELY(x) (x)
#define GS_UNLIKELY(x) (x)
#endif

enum {
    GS_OK = 0,
    GS_NO_MEMORY = 1,
    GS_BAD_GRAPH = 2,     /* an indptr/indices entry points outside its array */
    GS_BAD_WORKSPACE = 3, /* a workspace entry was not -1 at the start of the batch */
    GS_BAD_ARGUMENT = 4
};

/* The graph as the caller hands it over; mirrors ctypes.Structure `_Graph` in __init__.py. */
typedef struct {
    int64_t num_nodes;
    const void *indptr;      /* [num_nodes + 1], int32 or int64 per indptr_is64 */
    const void *indices;     /* [num_in_edges] */
    const void *out_indptr;  /* NULL unless direction is "both" */
    const void *out_indices;
    int64_t num_in_edges;
    int64_t num_out_edges;
    int32_t indptr_is64;
    int32_t indices_is64;
    int32_t out_indptr_is64;
    int32_t out_indices_is64;
} gs_graph;

/* ------------------------------------------------------------------------------ random */

/* xoshiro256** seeded through splitmix64: fast, statistically strong for sampling, and the
 * same stream on every platform, so a seed gives the same DENSE everywhere. */
typedef struct { uint64_t s[4]; } gs_rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void rng_seed(gs_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(gs_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static inline uint64_t mul_hi_lo(uint64_t a, uint64_t b, uint64_t *lo) {
#if defined(__SIZEOF_INT128__)
    __uint128_t m = (__uint128_t)a * b;
    *lo = (uint64_t)m;
    return (uint64_t)(m >> 64);
#else
    uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32, b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
    uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
    uint64_t mid = (p0 >> 32) + (p1 & 0xFFFFFFFFu) + (p2 & 0xFFFFFFFFu);
    *lo = (mid << 32) | (p0 & 0xFFFFFFFFu);
    return p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
#endif
}

/* Exactly uniform in [0, n), n >= 1: Lemire's multiply-shift with rejection, which needs a
 * division only in the rare rejection zone instead of a modulo per draw. */
static inline uint64_t rng_below(gs_rng *r, uint64_t n) {
    uint64_t lo, hi = mul_hi_lo(rng_next(r), n, &lo);
    if (GS_UNLIKELY(lo < n)) {
        uint64_t threshold = (0 - n) % n;
        while (lo < threshold) hi = mul_hi_lo(rng_next(r), n, &lo);
    }
    return hi;
}

/* ------------------------------------------------------------------------------ buffers */

typedef struct {
    int64_t *data;
    int64_t len, cap;
} gs_buf;

static int buf_reserve(gs_buf *b, int64_t extra) {
    int64_t need = b->len + extra;
    if (GS_LIKELY(need <= b->cap)) return GS_OK;
    int64_t cap = b->cap ? b->cap : 1024;
    while (cap < need) cap *= 2;
    int64_t *p = (int64_t *)realloc(b->data, (size_t)cap * sizeof(int64_t));
    if (!p) return GS_NO_MEMORY;
    b->data = p;
    b->cap = cap;
    return GS_OK;
}

/* The same for int32 entries. */
typedef struct {
    int32_t *data;
    int64_t len, cap;
} gs_buf32;

static int buf32_reserve(gs_buf32 *b, int64_t extra) {
    int64_t need = b->len + extra;
    if (GS_LIKELY(need <= b->cap)) return GS_OK;
    int64_t cap = b->cap ? b->cap : 1024;
    while (cap < need) cap *= 2;
    int32_t *p = (int32_t *)realloc(b->data, (size_t)cap * sizeof(int32_t));
    if (!p) return GS_NO_MEMORY;
    b->data = p;
    b->cap = cap;
    return GS_OK;
}

/* Floyd keeps the drawn slots of a node of degree up to this in a bitmap (512 bytes, in L1):
 * one bit test per draw instead of a scan of the slots drawn so far. */
#define GS_BITMAP_BITS 4096

typedef struct {
    void *mark;           /* the caller's workspace: discovery index of a reached node, else -1 */
    int32_t mark64;       /* its entries are int64 (else int32, half the cache footprint) */
    int32_t num_hops;
    int32_t want_edge_ids;
    int64_t num_nodes;
    gs_buf disc;          /* global id of every reached node, in discovery order */
    gs_buf counts;        /* sample size of every sampled node, in discovery order */
    gs_buf nbrs;          /* each sampled edge's neighbour as a discovery index ... */
    gs_buf32 nbrs32;      /* ... or here, when every index fits 32 bits (half the traffic) */
    int32_t narrow;       /* nbrs32 is in use: num_nodes <= INT32_MAX */
    gs_buf u;             /* one chunk's neighbours as global ids */
    gs_buf edge_ids;      /* each sampled edge's position (optional) */
    gs_buf pos;           /* one chunk's edge positions (len stays 0; cap is what counts) */
    int64_t *hop_start;   /* [num_hops + 2]: hop h's nodes are disc[hop_start[h]:hop_start[h+1]] */
    int64_t *edge_start;  /* [num_hops + 1]: hop h's edges are nbrs[edge_start[h]:edge_start[h+1]] */
    int64_t *slots;       /* [slots_cap] Floyd's chosen slots of one node */
    int64_t slots_cap;
    int64_t *table;       /* open-addressing set of slots for large fanouts, all -1 between uses */
    int64_t *table_pos;   /* [slots_cap] cell each of one node's slots took in `table` */
    int64_t table_mask;   /* table size - 1, or -1 before the table exists */
    uint64_t bits[GS_BITMAP_BITS / 64]; /* set of kept slots of a node with deg <= GS_BITMAP_BITS,
                                           all clear between uses */
} gs_ctx;

static void ctx_reset_mark(gs_ctx *c) {
    const int64_t *d = c->disc.data;
    if (c->mark64) {
        int64_t *mark = (int64_t *)c->mark;
        for (int64_t i = 0; i < c->disc.len; i++) mark[d[i]] = -1;
    } else {
        int32_t *mark = (int32_t *)c->mark;
        for (int64_t i = 0; i < c->disc.len; i++) mark[d[i]] = -1;
    }
}

static void ctx_free(gs_ctx *c) {
    if (!c) return;
    free(c->disc.data);
    free(c->counts.data);
    free(c->nbrs.data);
    free(c->nbrs32.data);
    free(c->u.data);
    free(c->edge_ids.data);
    free(c->pos.data);
    free(c->hop_start);
    free(c->edge_start);
    free(c->slots);
    free(c->table);
    free(c->table_pos);
    free(c);
}

/* ------------------------------------------------------------------------------ drawing */

/* Below this fanout a linear scan of the slots drawn so far beats hashing them. */
#define GS_SCAN_MAX 32

/* Cell of `key` in a linear-probing set of non-negative keys (-1 = empty): where it is, or
 * the empty cell that ends its probe sequence. The table is at least twice the largest
 * fanout, so a probe always ends. */
static inline int64_t table_probe(const int64_t *table, int64_t mask, int64_t key) {
    int64_t p = (int64_t)((((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 20) & (uint64_t)mask);
    while (table[p] >= 0 && table[p] != key) p = (p + 1) & mask;
    return p;
}

/* Room for k slots, and for k > GS_SCAN_MAX a set table of at least 2k cells. Grown on the
 * first node that needs it rather than sized by the fanout up front: a fanout far above
 * every degree never draws and must not allocate. */
static int floyd_reserve(gs_ctx *c, int64_t k) {
    if (k > c->slots_cap) {
        int64_t *p = (int64_t *)realloc(c->slots, (size_t)k * sizeof(int64_t));
        if (!p) return GS_NO_MEMORY;
        c->slots = p;
        if (k > GS_SCAN_MAX) {
            int64_t *q = (int64_t *)realloc(c->table_pos, (size_t)k * sizeof(int64_t));
            if (!q) return GS_NO_MEMORY;
            c->table_pos = q;
        }
    }
    if (k > GS_SCAN_MAX && 2 * k > c->table_mask + 1) {
        int64_t size = 64;
        while (size < 2 * k) size *= 2;
        free(c->table);
        c->table = (int64_t *)malloc((size_t)size * sizeof(int64_t));
        if (!c->table) {
            /* No capacity is claimed: callers reserve whenever count > slots_cap, so 0 makes
             * the next draw retry here instead of probing a NULL table. */
            c->table_mask = -1;
            c->slots_cap = 0;
            return GS_NO_MEMORY;
        }
        for (int64_t i = 0; i < size; i++) c->table[i] = -1;
        c->table_mask = size - 1;
    }
    /* Claimed only once every buffer for k draws exists. */
    if (k > c->slots_cap) c->slots_cap = k;
    return GS_OK;
}

/* Floyd's algorithm: a uniform k-subset of [0, deg), deg > k > 0, into slots[0:k]. For
 * j = deg-k .. deg-1 draw t in [0, j] and keep t, or j when t is already kept. O(k) draws
 * however large deg is, so a hub costs no more than any node with deg > k. */
static void floyd(gs_ctx *c, gs_rng *rng, int64_t deg, int64_t k) {
    int64_t *slots = c->slots;
    if (deg <= GS_BITMAP_BITS) {
        uint64_t *bits = c->bits;
        for (int64_t i = 0; i < k; i++) {
            int64_t j = deg - k + i;
            int64_t t = (int64_t)rng_below(rng, (uint64_t)j + 1);
            /* j is never kept yet (kept slots are below it), so a taken t becomes j. */
            if (bits[t >> 6] & ((uint64_t)1 << (t & 63))) t = j;
            bits[t >> 6] |= (uint64_t)1 << (t & 63);
            slots[i] = t;
        }
        for (int64_t i = 0; i < k; i++) bits[slots[i] >> 6] = 0;
        return;
    }
    if (k <= GS_SCAN_MAX) {
        for (int64_t i = 0; i < k; i++) {
            int64_t j = deg - k + i;
            int64_t t = (int64_t)rng_below(rng, (uint64_t)j + 1);
            for (int64_t q = 0; q < i; q++) {
                if (slots[q] == t) { t = j; break; }
            }
            slots[i] = t;
        }
        return;
    }
    int64_t *table = c->table, *where = c->table_pos, mask = c->table_mask;
    for (int64_t i = 0; i < k; i++) {
        int64_t j = deg - k + i;
        int64_t t = (int64_t)rng_below(rng, (uint64_t)j + 1);
        int64_t p = table_probe(table, mask, t);
        if (table[p] == t) {
            /* Every kept slot is below j, so j is absent: insert it at its own empty probe end. */
            t = j;
            p = table_probe(table, mask, t);
        }
        table[p] = t;
        where[i] = p;
        slots[i] = t;
    }
    /* The table holds only this node's slots, so emptying the cells they took restores it
     * to all -1 in O(k), however large the table is. */
    for (int64_t i = 0; i < k; i++) table[where[i]] = -1;
}

/* ------------------------------------------------------------------------------ hop loop */

static inline int64_t load(const void *p, int is64, int64_t i) {
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

static inline const void *addr(const void *p, int is64, int64_t i) {
    return is64 ? (const void *)((const int64_t *)p + i) : (const void *)((const int32_t *)p + i);
}

/* Why the hop loop is staged: almost every access is a cache miss (the node's pointers,
 * the drawn row entries, the neighbour's workspace entry, spread over hundreds of MB), and
 * a loop that does all three per edge waits for each miss in turn. So each hop runs in
 * chunks of about GS_CHUNK edges: (1) draw the chunk's slots, turn them into edge
 * positions and prefetch those row entries, (2) gather the neighbours at those positions
 * and prefetch their workspace entries, (3) look them up in the workspace, deduplicate and
 * record. Each stage thus asks for its data a whole chunk before the next stage uses it,
 * and tens of misses are in flight at once (stages 2 and 3 also prefetch GS_AHEAD entries
 * ahead, in case the chunk's lines were evicted; stage 1 prefetches the CSC pointers
 * GS_AHEAD nodes ahead). Order is unchanged: node by node, slot by slot, so the result
 * depends only on the seed. */
#define GS_CHUNK 2048
#define GS_AHEAD 48

/* Stage 1 for nodes disc[*next:hi] until about GS_CHUNK edges: append each node's count and
 * write its edge positions to pos (in-edges: index into indices; out-edges: num_in_edges +
 * index into out_indices). Returns the number of positions, or -1 on a bad graph. */
static int64_t draw_chunk(gs_ctx *c, const gs_graph *g, gs_rng *rng, int64_t *next, int64_t hi,
                          int64_t fanout, int both, int *rc) {
    const int64_t *disc = c->disc.data;
    const int ip64 = g->indptr_is64, op64 = g->out_indptr_is64;
    int64_t n = 0, i = *next;
    for (; i < hi && n < GS_CHUNK; i++) {
        if (i + GS_AHEAD < hi) {
            int64_t w = disc[i + GS_AHEAD];
            GS_PREFETCH(addr(g->indptr, ip64, w));
            if (both) GS_PREFETCH(addr(g->out_indptr, op64, w));
        }
        int64_t v = disc[i];
        int64_t in_start = load(g->indptr, ip64, v), in_end = load(g->indptr, ip64, v + 1);
        if (GS_UNLIKELY(in_start < 0 || in_end < in_start || in_end > g->num_in_edges)) {
            *rc = GS_BAD_GRAPH;
            return -1;
        }
        int64_t in_deg = in_end - in_start, deg = in_deg, out_start = 0;
        if (both) {
            out_start = load(g->out_indptr, op64, v);
            int64_t out_end = load(g->out_indptr, op64, v + 1);
            if (GS_UNLIKELY(out_start < 0 || out_end < out_start || out_end > g->num_out_edges)) {
                *rc = GS_BAD_GRAPH;
                return -1;
            }
            deg += out_end - out_start;
        }
        int64_t count = (fanout < 0 || deg <= fanout) ? deg : fanout;
        c->counts.data[c->counts.len++] = count;
        if (count == 0) continue;
        if (GS_UNLIKELY(n + count > c->pos.cap - c->pos.len)) {
            c->pos.len = n;  /* a hub taken whole can exceed the chunk: grow for it */
            if (buf_reserve(&c->pos, count)) { *rc = GS_NO_MEMORY; return -1; }
            c->pos.len = 0;
        }
        int64_t *pos = c->pos.data + n;
        const int64_t out_shift = g->num_in_edges + out_start - in_deg;
        if (count == deg) {
            if (!both || deg == in_deg) {
                for (int64_t e = 0; e < count; e++) pos[e] = in_start + e;
                if (!both) {
                    /* The row, a whole chunk before stage 2 reads it. */
                    const int64_t step = 64 / (g->indices_is64 ? 8 : 4);  /* entries per cache line */
                    for (int64_t e = 0; e < count; e += step)
                        GS_PREFETCH(addr(g->indices, g->indices_is64, in_start + e));
                }
            } else {
                for (int64_t e = 0; e < count; e++) pos[e] = e < in_deg ? in_start + e : out_shift + e;
            }
        } else {
            if (GS_UNLIKELY(count > c->slots_cap) && floyd_reserve(c, count)) {
                *rc = GS_NO_MEMORY;
                return -1;
            }
            floyd(c, rng, deg, count);
            const int64_t *slots = c->slots;
            if (!both) {
                for (int64_t e = 0; e < count; e++) {
                    pos[e] = in_start + slots[e];
                    GS_PREFETCH(addr(g->indices, g->indices_is64, pos[e]));
                }
            } else {
                for (int64_t e = 0; e < count; e++)
                    pos[e] = slots[e] < in_deg ? in_start + slots[e] : out_shift + slots[e];
            }
        }
        n += count;
    }
    *next = i;
    return n;
}

/* Stage 2: nbr[e] = the neighbour at position pos[e]; -1 if any is out of range. One loop
 * per index dtype keeps the dtype test out of the per-edge path. */
#define GS_GATHER(T)                                                                          \
    static int gather_##T(const T *indices, const int64_t *pos, int64_t *nbr, int64_t n,       \
                          int64_t num_nodes, const char *mark, int mark_shift) {               \
        for (int64_t e = 0; e < n; e++) {                                                      \
            if (e + GS_AHEAD < n) GS_PREFETCH(indices + pos[e + GS_AHEAD]);                    \
            int64_t u = (int64_t)indices[pos[e]];                                              \
            if (GS_UNLIKELY((uint64_t)u >= (uint64_t)num_nodes)) return -1;                    \
            GS_PREFETCH_W(mark + (u << mark_shift));                                           \
            nbr[e] = u;                                                                        \
        }                                                                                      \
        return 0;                                                                              \
    }
GS_GATHER(int32_t)
GS_GATHER(int64_t)

static int gather_both(const gs_graph *g, const int64_t *pos, int64_t *nbr, int64_t n) {
    const int64_t m = g->num_in_edges;
    for (int64_t e = 0; e < n; e++) {
        if (e + GS_AHEAD < n) {
            int64_t p = pos[e + GS_AHEAD];
            GS_PREFETCH(p < m ? addr(g->indices, g->indices_is64, p)
                              : addr(g->out_indices, g->out_indices_is64, p - m));
        }
        int64_t p = pos[e];
        int64_t u = p < m ? load(g->indices, g->indices_is64, p)
                          : load(g->out_indices, g->out_indices_is64, p - m);
        if (GS_UNLIKELY((uint64_t)u >= (uint64_t)g->num_nodes)) return -1;
        nbr[e] = u;
    }
    return 0;
}

/* One hop: sample every node of disc[lo:hi] with `fanout`, appending the new nodes to disc. */
static int sample_hop(gs_ctx *c, const gs_graph *g, gs_rng *rng, int64_t lo, int64_t hi, int64_t fanout,
                      int both) {
    int rc = GS_OK;
    if (fanout == 0) {
        /* Nothing to draw or gather: every node's sample is empty. */
        for (int64_t i = lo; i < hi; i++) c->counts.data[c->counts.len++] = 0;
        return GS_OK;
    }
    for (int64_t i = lo; i < hi;) {
        int64_t n = draw_chunk(c, g, rng, &i, hi, fanout, both, &rc);
        if (n < 0) return rc;
        if (n == 0) continue;
        if ((c->narrow ? buf32_reserve(&c->nbrs32, n) : buf_reserve(&c->nbrs, n)) || buf_reserve(&c->disc, n)
            || buf_reserve(&c->u, n) || (c->want_edge_ids && buf_reserve(&c->edge_ids, n)))
            return GS_NO_MEMORY;
        const int64_t *pos = c->pos.data;
        int64_t *nb = c->u.data;
        int bad;
        if (both) bad = gather_both(g, pos, nb, n);
        else if (g->indices_is64)
            bad = gather_int64_t((const int64_t *)g->indices, pos, nb, n, g->num_nodes, (const char *)c->mark,
                                 c->mark64 ? 3 : 2);
        else
            bad = gather_int32_t((const int32_t *)g->indices, pos, nb, n, g->num_nodes, (const char *)c->mark,
                                 c->mark64 ? 3 : 2);
        if (bad) return GS_BAD_GRAPH;
        if (c->want_edge_ids) {
            memcpy(c->edge_ids.data + c->edge_ids.len, pos, (size_t)n * sizeof(int64_t));
            c->edge_ids.len += n;
        }
        int64_t *disc = c->disc.data;
        int64_t ndisc = c->disc.len;
        /* Stage 3, one loop per (workspace, output) width; an int32 workspace implies a
         * graph below 2**31 nodes, hence int32 output. */
#define GS_DEDUP(MT, OUT, T)                                                                  \
        {                                                                                     \
            MT *mark = (MT *)c->mark;                                                         \
            for (int64_t e = 0; e < GS_AHEAD && e < n; e++) GS_PREFETCH_W(mark + nb[e]);      \
            for (int64_t e = 0; e < n; e++) {                                                 \
                if (e + GS_AHEAD < n) GS_PREFETCH_W(mark + nb[e + GS_AHEAD]);                 \
                int64_t u = nb[e];                                                            \
                int64_t m = (int64_t)mark[u];                                                 \
                if (m < 0) {                                                                  \
                    m = ndisc;                                                                \
                    mark[u] = (MT)m;                                                          \
                    disc[ndisc++] = u;                                                        \
                } else if (GS_UNLIKELY(m >= ndisc)) {                                         \
                    c->disc.len = ndisc;                                                      \
                    return GS_BAD_WORKSPACE;                                                  \
                }                                                                             \
                (OUT)[e] = (T)m;                                                              \
            }                                                                                 \
        }
        if (c->narrow) {
            int32_t *out = c->nbrs32.data + c->nbrs32.len;
            if (c->mark64) GS_DEDUP(int64_t, out, int32_t)
            else GS_DEDUP(int32_t, out, int32_t)
            c->nbrs32.len += n;
        } else {
            int64_t *out = c->nbrs.data + c->nbrs.len;
            GS_DEDUP(int64_t, out, int64_t)
            c->nbrs.len += n;
        }
#undef GS_DEDUP
        c->disc.len = ndisc;
    }
    return GS_OK;
}

/* ------------------------------------------------------------------------------ API */

/* A sampling context: the buffers of one batch, kept from batch to batch. Fresh memory costs
 * a page fault and a page clear per 4 KiB (about 25 ms per 100 MB here), as much as the
 * sampling itself at large fanouts, so a caller keeps one context per thread. */
GS_EXPORT void *gs_ctx_new(void) {
    gs_ctx *c = (gs_ctx *)calloc(1, sizeof(gs_ctx));
    if (c) c->table_mask = -1;
    return c;
}

GS_EXPORT void gs_ctx_free(void *ctx) {
    gs_ctx *c = (gs_ctx *)ctx;
    if (c && c->mark) ctx_reset_mark(c);
    ctx_free(c);
}

/* Give back a buffer's memory when the last batch used under a quarter of it: keeps one
 * exceptional batch from pinning its peak for the rest of the process. */
static void buf_trim(gs_buf *b) {
    if (b->cap > (1 << 20) && b->cap > 4 * b->len) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    b->len = 0;
}

/* Forget the batch: workspace entries back to -1, buffers trimmed, context reusable. */
static void ctx_end_batch(gs_ctx *c) {
    if (c->mark) ctx_reset_mark(c);
    c->mark = NULL;
    buf_trim(&c->disc);
    buf_trim(&c->counts);
    buf_trim(&c->nbrs);
    if (c->nbrs32.cap > (1 << 21) && c->nbrs32.cap > 4 * c->nbrs32.len) {
        free(c->nbrs32.data);
        c->nbrs32.data = NULL;
        c->nbrs32.cap = 0;
    }
    c->nbrs32.len = 0;
    buf_trim(&c->edge_ids);
}

/* Sample `num_hops` hops from `targets` into the context `ctx` (from gs_ctx_new, not in the
 * middle of another batch).
 *
 * targets: [num_targets] distinct ids in [0, num_nodes). fanouts: [num_hops], fanouts[0] for
 * the targets, -1 = all, 0 = none. mark: the caller's workspace, [num_nodes] all -1, int64
 * when mark64 else int32 (only for num_nodes <= INT32_MAX); left as the discovery index of
 * every reached node until gs_dense_export or gs_dense_discard. both:
 * in- and out-neighbours (graph->out_* set). On success block_sizes[h] is the number of
 * nodes first reached at hop h (h = 0 .. num_hops) and *num_edges the number of sampled
 * edges; the caller must then export or discard. On failure the workspace is already reset. */
GS_EXPORT int gs_dense_sample(void *ctx, const gs_graph *g, const int64_t *targets, int64_t num_targets,
                              const int64_t *fanouts, int32_t num_hops, int32_t both, uint64_t seed,
                              int32_t want_edge_ids, void *mark, int32_t mark64, int64_t *block_sizes,
                              int64_t *num_edges) {
    gs_ctx *c = (gs_ctx *)ctx;
    /* out_indices may be NULL: an empty tensor has no storage. */
    if (!c || c->mark || num_hops < 1 || num_targets < 0 || (both && !g->out_indptr)
        || (!mark64 && g->num_nodes > INT32_MAX))
        return GS_BAD_ARGUMENT;
    for (int32_t h = 0; h < num_hops; h++) {
        if (fanouts[h] < -1) return GS_BAD_ARGUMENT;
    }
    c->num_hops = num_hops;
    c->want_edge_ids = want_edge_ids;
    c->num_nodes = g->num_nodes;
    c->disc.len = c->counts.len = c->nbrs.len = c->nbrs32.len = c->edge_ids.len = c->pos.len = c->u.len = 0;
    c->narrow = g->num_nodes <= INT32_MAX;
    int64_t *hs = (int64_t *)realloc(c->hop_start, ((size_t)num_hops + 2) * sizeof(int64_t));
    if (hs) c->hop_start = hs;
    int64_t *es = (int64_t *)realloc(c->edge_start, ((size_t)num_hops + 1) * sizeof(int64_t));
    if (es) c->edge_start = es;
    if (!hs || !es) return GS_NO_MEMORY;
    hs[0] = 0;
    int rc = buf_reserve(&c->pos, 2 * GS_CHUNK);
    if (rc == GS_OK) rc = buf_reserve(&c->disc, num_targets);
    c->mark = mark;  /* from here on, ctx_end_batch resets what the batch set */
    c->mark64 = mark64;
    if (rc == GS_OK) {
        for (int64_t i = 0; i < num_targets; i++) {
            int64_t t = targets[i];
            if (mark64 ? ((int64_t *)mark)[t] != -1 : ((int32_t *)mark)[t] != -1) {
                rc = GS_BAD_WORKSPACE;
                break;
            }
            if (mark64) ((int64_t *)mark)[t] = i;
            else ((int32_t *)mark)[t] = (int32_t)i;
            c->disc.data[c->disc.len++] = t;
        }
    }
    gs_rng rng;
    rng_seed(&rng, seed);
    for (int32_t h = 0; rc == GS_OK && h < num_hops; h++) {
        int64_t lo = hs[h], hi = c->disc.len;
        hs[h + 1] = hi;
        es[h] = c->narrow ? c->nbrs32.len : c->nbrs.len;
        /* Every node of this hop gets one count; reserving them up front keeps the chunk
         * loop free of a per-node capacity check. */
        rc = buf_reserve(&c->counts, hi - lo);
        if (rc == GS_OK) rc = sample_hop(c, g, &rng, lo, hi, fanouts[h], both);
    }
    if (rc != GS_OK) {
        ctx_end_batch(c);
        return rc;
    }
    hs[num_hops + 1] = c->disc.len;
    es[num_hops] = c->narrow ? c->nbrs32.len : c->nbrs.len;
    for (int32_t h = 0; h <= num_hops; h++) block_sizes[h] = hs[h + 1] - hs[h];
    *num_edges = es[num_hops];
    return GS_OK;
}

/* Write the sampled batch in DENSE order into the caller's arrays, reset the workspace, and
 * make the context ready for the next batch.
 *
 * node_ids [N]: hop num_hops first, the targets last. nbr_offsets [S + 1] with S the nodes of
 * hops 0 .. num_hops-1. nbrs [E]: indices into node_ids. edge_ids [E] or NULL: the sampled
 * edges' positions (in-edges: index into indices; out-edges: num_in_edges + index into
 * out_indices). Hop blocks, and each hop's samples, go outermost first, because DENSE puts
 * the outermost hop first and the targets last. */
GS_EXPORT int gs_dense_export(void *ctx, int64_t *node_ids, int64_t *nbrs, int64_t *nbr_offsets,
                              int64_t *edge_ids) {
    gs_ctx *c = (gs_ctx *)ctx;
    if (!c || !c->mark) return GS_BAD_ARGUMENT;
    const int32_t L = c->num_hops;
    const int64_t N = c->disc.len;
    const int64_t *hs = c->hop_start, *es = c->edge_start;
    /* Node of discovery index i in hop h sits at i + delta[h] in node_ids. */
    int64_t delta[64];
    int64_t *delta_p = L + 1 <= 64 ? delta : (int64_t *)malloc(((size_t)L + 1) * sizeof(int64_t));
    if (!delta_p) {
        ctx_end_batch(c);
        return GS_NO_MEMORY;
    }
    for (int32_t h = 0; h <= L; h++) delta_p[h] = N - hs[h + 1] - hs[h];
    for (int32_t h = 0; h <= L; h++) {
        for (int64_t i = hs[h]; i < hs[h + 1]; i++) node_ids[i + delta_p[h]] = c->disc.data[i];
    }
    int64_t row = 0, out = 0;
    nbr_offsets[0] = 0;
    for (int32_t h = L - 1; h >= 0; h--) {
        for (int64_t i = hs[h]; i < hs[h + 1]; i++) {
            nbr_offsets[row + 1] = nbr_offsets[row] + c->counts.data[i];
            row++;
        }
        int64_t *dst = nbrs + out - es[h];
        const int64_t e_lo = es[h], e_hi = es[h + 1];
        if (L <= 8) {
            /* A neighbour of hop h is in hop <= h + 1; selecting its shift with conditional
             * moves avoids a mispredicted branch per edge (that search was most of this pass). */
            int64_t b[9], d[9];
            for (int32_t q = 0; q <= L; q++) { b[q] = hs[q]; d[q] = delta_p[q]; }
            const int32_t top = h + 1;
#define GS_REMAP(SRC)                                                                         \
            for (int64_t e = e_lo; e < e_hi; e++) {                                           \
                int64_t m = (SRC)[e], shift = d[0];                                           \
                for (int32_t q = 1; q <= top; q++) shift = m >= b[q] ? d[q] : shift;          \
                dst[e] = m + shift;                                                           \
            }
            if (c->narrow) { const int32_t *src = c->nbrs32.data; GS_REMAP(src) }
            else { const int64_t *src = c->nbrs.data; GS_REMAP(src) }
#undef GS_REMAP
        } else {
            for (int64_t e = e_lo; e < e_hi; e++) {
                int64_t m = c->narrow ? (int64_t)c->nbrs32.data[e] : c->nbrs.data[e];
                int32_t hm = 0;
                while (m >= hs[hm + 1]) hm++;
                dst[e] = m + delta_p[hm];
            }
        }
        if (edge_ids)
            memcpy(edge_ids + out, c->edge_ids.data + es[h], (size_t)(es[h + 1] - es[h]) * sizeof(int64_t));
        out += es[h + 1] - es[h];
    }
    if (delta_p != delta) free(delta_p);
    ctx_end_batch(c);
    return GS_OK;
}

/* Drop a sampled batch without exporting it (e.g. the caller could not allocate the
 * outputs): reset the workspace and make the context ready for the next batch. */
GS_EXPORT void gs_dense_discard(void *ctx) {
    gs_ctx *c = (gs_ctx *)ctx;
    if (c && c->mark) ctx_end_batch(c);
}

/* The ABI version the Python side checks, bumped whenever a signature above changes. */
GS_EXPORT int32_t gs_abi_version(void) { return 3; }
