/* Top-k selection of the indexer: candidates are ordered by the 64-bit key (score, -index), a
 * strict total order, so the chosen set does not depend on how candidates were split among
 * threads. The fast path streams candidates through a buffer of 2k keys: a candidate enters only
 * if it beats the current k-th best; when the buffer fills, a quickselect keeps the best k and
 * raises the bar. Only the final k keys are sorted. */
#include "backends/cpu/indexer_cpu.h"

static inline void swap_keys(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Rearrange a[0..n) so that a[0..k) are its k largest keys (distinct keys), a[k-1] the k-th. */
static void select_top(uint64_t *a, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1, want = k - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        uint64_t x = a[lo], y = a[mid], z = a[hi];
        uint64_t piv = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > piv) i++;
            while (a[j] < piv) j--;
            if (i <= j) swap_keys(&a[i++], &a[j--]);
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
}

static void sift_down_min(uint64_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, s = i;
        if (l < n && h[l] < h[s]) s = l;
        if (l + 1 < n && h[l + 1] < h[s]) s = l + 1;
        if (s == i) return;
        swap_keys(&h[i], &h[s]);
        i = s;
    }
}

/* Heapsort into descending order (in place, no allocation). */
static void sort_desc(uint64_t *a, int64_t n)
{
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down_min(a, n, i);
    for (int64_t end = n - 1; end > 0; end--) {
        swap_keys(&a[0], &a[end]);
        sift_down_min(a, end, 0);
    }
}

void dsv4_ix_heap_push(uint64_t *heap, int64_t *size, int64_t k, uint64_t key)
{
    if (*size < k) {
        int64_t i = (*size)++;
        heap[i] = key;
        while (i > 0 && heap[(i - 1) / 2] > heap[i]) {
            swap_keys(&heap[(i - 1) / 2], &heap[i]);
            i = (i - 1) / 2;
        }
    } else if (key > heap[0]) {
        heap[0] = key;
        sift_down_min(heap, *size, 0);
    }
}

void dsv4_ix_stream_init(dsv4_ix_stream *s, uint64_t *keys, int64_t k)
{
    s->keys = keys;
    s->n = 0;
    s->k = k;
    s->thr = 0; /* every real key is > 0: NaN and -inf rank above it */
}

void dsv4_ix_stream_push(dsv4_ix_stream *s, const float *scores, int64_t c0, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t key = dsv4_ix_key(scores[i], c0 + i);
        if (key <= s->thr) continue;
        s->keys[s->n++] = key;
        if (s->n == 2 * s->k) {
            select_top(s->keys, s->n, s->k);
            s->n = s->k;
            s->thr = s->keys[s->k - 1];
        }
    }
}

int64_t dsv4_ix_keep_best(uint64_t *keys, int64_t n, int64_t k)
{
    if (n <= k) return n;
    select_top(keys, n, k);
    return k;
}

int64_t dsv4_ix_stream_finish(dsv4_ix_stream *s)
{
    s->n = dsv4_ix_keep_best(s->keys, s->n, s->k);
    return s->n;
}

void dsv4_ix_emit(uint64_t *keys, int64_t n, const dsv4_topk_out *out, int64_t t)
{
    sort_desc(keys, n);
    int32_t *idx = out->indices + t * out->ld_indices;
    for (int64_t i = 0; i < n; i++) idx[i] = dsv4_ix_key_index(keys[i]);
    for (int64_t i = n; i < out->topk; i++) idx[i] = -1;
    out->lengths[t * out->ld_lengths] = (int32_t)n;
}

size_t dsv4_ix_workspace_size(const dsv4_exec *ex, int64_t tokens, int64_t topk)
{
    (void)tokens;
    size_t p = (size_t)(ex->threads > 0 ? ex->threads : 1);
    return 64 + p * sizeof(int64_t) + p * 2 * (size_t)topk * sizeof(uint64_t);
}
