/* tk's attention (and ranking) kernels for ONNX Runtime's CPU provider: a custom-operator library, built on the machine that runs
 * it (toolkit/runtimes/onnxruntime/native.py) and loaded with SessionOptions.register_custom_ops_library.
 *
 * Why: at a decoder step each query is one position, and ONNX Runtime's MultiHeadAttention makes two small matrix
 * products per row and head (plus, for self-attention, a copy of the cache into its present output). At 64 rows of
 * the shipped model that is 150 to 470 us a node for a few thousand multiply-adds; here each (row, head) is a
 * dot-product loop over the keys, a softmax and a weighted sum of the values, in one pass while the data is in cache.
 *
 *   tk.kernels.CrossAttention(query [G, R, H*D], key [G, H, S, D], value [G, H, S, D], lengths int32 [G])
 *       -> output [G, R, H*D]
 *     Each group's R query rows attend to the first lengths[g] of its S keys (a beam's rows share their sentence's
 *     keys: toolkit.graphs.sentence_cross); what com.microsoft.MultiHeadAttention computes with a 1-D
 *     key_padding_mask of source lengths.
 *   tk.kernels.SelfAttention(query [B, 1, H*D], key [B, 1, H*D], value [B, 1, H*D], past_key [B, H, P, D],
 *                            past_value [B, H, P, D]) -> output [B, 1, H*D], present_key [B, H, P+1, D], present_value
 *     One new position attending to the cache and itself: MultiHeadAttention with past and present, no mask.
 *   tk.kernels.SelfAttentionRows(query, key, value, past_key [B', H, P, D], past_value, rows int64 [B]) -> the same
 *     Row b continues past row rows[b]: a beam step's reorder of the cache done by the copy into the present.
 *   Attributes of both: num_heads (int), scale (float).
 *   tk.kernels.TopK(values [R, N], k int64 [1]) -> values [R, k], ids int64 [R, k]
 *     ONNX TopK's result (largest, sorted, equal values in id order) for a beam's ranking of each row's
 *     log-probabilities: a threshold pass and a pass that inserts the few values above it, both vector compares (64 x
 *     6,000, k = 8, one thread: 87 us against ONNX Runtime's 208).
 *
 * Each (row, head) is computed on its own, in one fixed order, so a row's output does not depend on the batch it is
 * in. No part of ONNX Runtime's headers is used: the few entries of its C ABI this library calls are declared below
 * by their place in the function table (OrtApi, version 16; the table only ever grows at its end).
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtShape;

typedef struct {
    const void *const *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

#define API_VERSION 16
#define ERROR_INVALID_ARGUMENT 2
#define TYPE_FLOAT 1
#define TYPE_INT32 6
#define TYPE_INT64 7

/* Places in the OrtApi function table. */
enum {
    CREATE_STATUS = 0,
    CREATE_CUSTOM_OP_DOMAIN = 26,
    CUSTOM_OP_DOMAIN_ADD = 27,
    ADD_CUSTOM_OP_DOMAIN = 28,
    GET_TENSOR_MUTABLE_DATA = 51,
    GET_DIMENSIONS_COUNT = 61,
    GET_DIMENSIONS = 62,
    GET_TENSOR_TYPE_AND_SHAPE = 65,
    KERNEL_INFO_GET_ATTRIBUTE_FLOAT = 85,
    KERNEL_INFO_GET_ATTRIBUTE_INT64 = 86,
    KERNEL_CONTEXT_GET_INPUT = 90,
    KERNEL_CONTEXT_GET_OUTPUT = 91,
    RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
};

static const void *const *api;
#define FN(type, place) ((type)api[place])
typedef OrtStatus *(*CreateStatusFn)(int, const char *);
typedef OrtStatus *(*CreateDomainFn)(const char *, OrtCustomOpDomain **);
typedef OrtStatus *(*DomainAddFn)(OrtCustomOpDomain *, const void *);
typedef OrtStatus *(*AddDomainFn)(OrtSessionOptions *, OrtCustomOpDomain *);
typedef OrtStatus *(*MutableDataFn)(const OrtValue *, void **);
typedef OrtStatus *(*DimsCountFn)(const OrtShape *, size_t *);
typedef OrtStatus *(*DimsFn)(const OrtShape *, int64_t *, size_t);
typedef OrtStatus *(*TypeAndShapeFn)(const OrtValue *, OrtShape **);
typedef OrtStatus *(*AttrFloatFn)(const OrtKernelInfo *, const char *, float *);
typedef OrtStatus *(*AttrIntFn)(const OrtKernelInfo *, const char *, int64_t *);
typedef OrtStatus *(*GetInputFn)(const OrtKernelContext *, size_t, const OrtValue **);
typedef OrtStatus *(*GetOutputFn)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **);
typedef void (*ReleaseShapeFn)(OrtShape *);

/* OrtCustomOp as read by ONNX Runtime at version 16 (CreateKernelV2 and KernelComputeV2: errors come back as a status). */
typedef struct CustomOp {
    uint32_t version;
    void *(*CreateKernel)(const struct CustomOp *, const void *, const OrtKernelInfo *);
    const char *(*GetName)(const struct CustomOp *);
    const char *(*GetExecutionProviderType)(const struct CustomOp *);
    int (*GetInputType)(const struct CustomOp *, size_t);
    size_t (*GetInputTypeCount)(const struct CustomOp *);
    int (*GetOutputType)(const struct CustomOp *, size_t);
    size_t (*GetOutputTypeCount)(const struct CustomOp *);
    void (*KernelCompute)(void *, OrtKernelContext *);
    void (*KernelDestroy)(void *);
    int (*GetInputCharacteristic)(const struct CustomOp *, size_t);
    int (*GetOutputCharacteristic)(const struct CustomOp *, size_t);
    int (*GetInputMemoryType)(const struct CustomOp *, size_t);
    int (*GetVariadicInputMinArity)(const struct CustomOp *);
    int (*GetVariadicInputHomogeneity)(const struct CustomOp *);
    int (*GetVariadicOutputMinArity)(const struct CustomOp *);
    int (*GetVariadicOutputHomogeneity)(const struct CustomOp *);
    OrtStatus *(*CreateKernelV2)(const struct CustomOp *, const void *, const OrtKernelInfo *, void **);
    OrtStatus *(*KernelComputeV2)(void *, OrtKernelContext *);
} CustomOp;

typedef struct {
    int64_t heads;
    float scale;
} Kernel;

static OrtStatus *fail(const char *what) {
    return FN(CreateStatusFn, CREATE_STATUS)(ERROR_INVALID_ARGUMENT, what);
}

static OrtStatus *create_kernel(const CustomOp *op, const void *unused, const OrtKernelInfo *info, void **out) {
    (void)op, (void)unused;
    Kernel k;
    OrtStatus *status = FN(AttrIntFn, KERNEL_INFO_GET_ATTRIBUTE_INT64)(info, "num_heads", &k.heads);
    if (status) return status;
    if ((status = FN(AttrFloatFn, KERNEL_INFO_GET_ATTRIBUTE_FLOAT)(info, "scale", &k.scale))) return status;
    if (k.heads < 1) return fail("tk.kernels attention: num_heads must be at least 1");
    Kernel *kernel = malloc(sizeof k);
    if (!kernel) return fail("tk.kernels attention: out of memory");
    *kernel = k;
    *out = kernel;
    return NULL;
}

/* A kernel without attributes (TopK): a pointer that destroy_kernel may free. */
static OrtStatus *create_plain(const CustomOp *op, const void *unused, const OrtKernelInfo *info, void **out) {
    (void)op, (void)unused, (void)info;
    *out = malloc(1);
    return *out ? NULL : fail("tk.kernels: out of memory");
}

static void destroy_kernel(void *kernel) { free(kernel); }

typedef struct {
    const float *data;
    const int32_t *ints;
    int64_t dims[4];
    size_t rank;
} Tensor;

static OrtStatus *input(OrtKernelContext *context, size_t index, Tensor *t) {
    const OrtValue *value;
    OrtShape *shape;
    OrtStatus *status = FN(GetInputFn, KERNEL_CONTEXT_GET_INPUT)(context, index, &value);
    if (status) return status;
    if ((status = FN(TypeAndShapeFn, GET_TENSOR_TYPE_AND_SHAPE)(value, &shape))) return status;
    status = FN(DimsCountFn, GET_DIMENSIONS_COUNT)(shape, &t->rank);
    if (!status && t->rank > 4) status = fail("tk.kernels attention: an input has more than 4 dimensions");
    if (!status) status = FN(DimsFn, GET_DIMENSIONS)(shape, t->dims, t->rank);
    FN(ReleaseShapeFn, RELEASE_TENSOR_TYPE_AND_SHAPE_INFO)(shape);
    if (status) return status;
    void *data;
    if ((status = FN(MutableDataFn, GET_TENSOR_MUTABLE_DATA)(value, &data))) return status;
    t->data = data;
    t->ints = data;
    return NULL;
}

static OrtStatus *output(OrtKernelContext *context, size_t index, const int64_t *dims, size_t rank, void *data) {
    OrtValue *value;
    OrtStatus *status = FN(GetOutputFn, KERNEL_CONTEXT_GET_OUTPUT)(context, index, dims, rank, &value);
    if (status) return status;
    return FN(MutableDataFn, GET_TENSOR_MUTABLE_DATA)(value, (void **)data);
}

/* e^x for x <= 0 (scores less their maximum), in a form the compiler turns into vector code: x = n ln2 + r with
 * |r| <= ln2/2, e^r by a degree-6 polynomial (relative error under 3e-7, about float's rounding), times 2^n built in
 * the exponent bits. Below -87 the result is 0 to float's precision for a softmax. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    /* n = x log2(e) rounded to the nearest integer (ties to even) by adding and taking away 1.5 * 2^23: plain float
     * arithmetic, so it is vector code on every machine (roundf is a library call where the CPU has no instruction for
     * its ties-away rounding: 4 ms for 140 x 6,000 values against 0.1). */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

#define LANES 16

/* q.k in a fixed order: sixteen running sums (one vector of them), each over every sixteenth element, then added
 * pairwise. Written out rather than left to the compiler, which may only reorder a sum when told it may: so each row's
 * score is the same bits whatever the batch, the build's vector width or the loop around it. */
static inline float dot(const float *restrict q, const float *restrict k, int64_t dim) {
    float lanes[LANES] = {0};
    int64_t d = 0;
    for (; d + LANES <= dim; d += LANES)
        for (int l = 0; l < LANES; l++) lanes[l] += q[d + l] * k[d + l];
    for (int l = 0; d < dim; d++, l++) lanes[l] += q[d] * k[d];
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
    return lanes[0];
}

/* One query row of one head over `n` keys: out = softmax(scale * q.K^T) V. `scores` holds n floats. Every sum is in
 * a fixed order (the exponentials' in key order, the output's over keys element by element). */
static void attend(const float *restrict q, const float *restrict keys, const float *restrict values, int64_t n,
                   int64_t dim, float scale, float *restrict out, float *restrict scores) {
    float top = -INFINITY;
    for (int64_t s = 0; s < n; s++) {
        scores[s] = dot(q, keys + s * dim, dim) * scale;
        top = scores[s] > top ? scores[s] : top;
    }
#pragma omp simd
    for (int64_t s = 0; s < n; s++) scores[s] = exp_nonpositive(scores[s] - top);
    float sum = 0.0f;
    for (int64_t s = 0; s < n; s++) sum += scores[s];
    float norm = 1.0f / sum;
    for (int64_t d = 0; d < dim; d++) out[d] = 0.0f;
    for (int64_t s = 0; s < n; s++) {
        const float *restrict v = values + s * dim;
        float p = scores[s] * norm;
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) out[d] += p * v[d];
    }
}

/* attend() for heads of 64 (the shipped model's, opus-mt's and NLLB's): the same arithmetic in the same order, with the
 * sizes known here, so the compiler keeps a row's scores' running sums and its output in registers. */
static void attend64(const float *restrict q, const float *restrict keys, const float *restrict values, int64_t n,
                     float scale, float *restrict out, float *restrict scores) {
    float top = -INFINITY;
    for (int64_t s = 0; s < n; s++) {
        const float *restrict k = keys + s * 64;
        float lanes[LANES] = {0};
        for (int d = 0; d < 64; d += LANES)
            for (int l = 0; l < LANES; l++) lanes[l] += q[d + l] * k[d + l];
        for (int width = LANES / 2; width > 0; width /= 2)
            for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
        scores[s] = lanes[0] * scale;
        top = scores[s] > top ? scores[s] : top;
    }
#pragma omp simd
    for (int64_t s = 0; s < n; s++) scores[s] = exp_nonpositive(scores[s] - top);
    float sum = 0.0f;
    for (int64_t s = 0; s < n; s++) sum += scores[s];
    float norm = 1.0f / sum, acc[64] = {0};
    for (int64_t s = 0; s < n; s++) {
        const float *restrict v = values + s * 64;
        float p = scores[s] * norm;
        for (int d = 0; d < 64; d++) acc[d] += p * v[d];
    }
    for (int d = 0; d < 64; d++) out[d] = acc[d];
}

/* The one entry both kernels call. */
static inline void attend_row(const float *restrict q, const float *restrict keys, const float *restrict values, int64_t n,
                              int64_t dim, float scale, float *restrict out, float *restrict scores) {
    if (dim == 64)
        attend64(q, keys, values, n, scale, out, scores);
    else
        attend(q, keys, values, n, dim, scale, out, scores);
}

#define MAX_KEYS 8192  /* positions a key block may have: the scores live on the stack (32 KiB) */

static OrtStatus *cross_compute(void *kernel, OrtKernelContext *context) {
    const Kernel *k = kernel;
    Tensor q, keys, values, lengths;
    OrtStatus *status;
    if ((status = input(context, 0, &q)) || (status = input(context, 1, &keys)) || (status = input(context, 2, &values)) ||
        (status = input(context, 3, &lengths)))
        return status;
    if (q.rank != 3 || keys.rank != 4 || values.rank != 4 || lengths.rank != 1)
        return fail("tk.kernels.CrossAttention: expected query [G, R, H*D], key and value [G, H, S, D], lengths [G]");
    int64_t groups = q.dims[0], rows = q.dims[1], width = q.dims[2], heads = k->heads, keys_n = keys.dims[2], dim = keys.dims[3];
    if (keys.dims[0] != groups || keys.dims[1] != heads || heads * dim != width || memcmp(keys.dims, values.dims, sizeof keys.dims) ||
        lengths.dims[0] != groups || keys_n > MAX_KEYS)
        return fail("tk.kernels.CrossAttention: the query, keys, values and lengths do not agree in shape");
    float *out;
    if ((status = output(context, 0, q.dims, 3, &out))) return status;
    float scores[keys_n > 0 ? keys_n : 1];
    for (int64_t g = 0; g < groups; g++) {
        int64_t n = lengths.ints[g] < 0 ? 0 : lengths.ints[g] > keys_n ? keys_n : lengths.ints[g];
        for (int64_t h = 0; h < heads; h++) {
            const float *kh = keys.data + (g * heads + h) * keys_n * dim, *vh = values.data + (g * heads + h) * keys_n * dim;
            for (int64_t r = 0; r < rows; r++) {
                int64_t at = (g * rows + r) * width + h * dim;
                if (n == 0) {
                    memset(out + at, 0, dim * sizeof(float));
                    continue;
                }
                attend_row(q.data + at, kh, vh, n, dim, k->scale, out + at, scores);
            }
        }
    }
    return NULL;
}

/* SelfAttention, and SelfAttentionRows: the same with the row of the past each row continues (`rows`, int64 [B], into a
 * past of any number of rows), so a beam step's reorder of the cache is this kernel's copy of it into the present
 * instead of a copy of its own. */
static OrtStatus *self_attend(const Kernel *k, OrtKernelContext *context, int with_rows) {
    Tensor q, key, value, past_k, past_v, rows = {0};
    OrtStatus *status;
    if ((status = input(context, 0, &q)) || (status = input(context, 1, &key)) || (status = input(context, 2, &value)) ||
        (status = input(context, 3, &past_k)) || (status = input(context, 4, &past_v)) ||
        (with_rows && (status = input(context, 5, &rows))))
        return status;
    if (q.rank != 3 || key.rank != 3 || value.rank != 3 || past_k.rank != 4 || past_v.rank != 4 || (with_rows && rows.rank != 1))
        return fail("tk.kernels.SelfAttention: expected query, key and value [B, 1, H*D], past key and value [B, H, P, D]");
    int64_t batch = q.dims[0], width = q.dims[2], heads = k->heads, past = past_k.dims[2], dim = past_k.dims[3];
    int64_t past_rows = past_k.dims[0];
    const int64_t *from = with_rows ? (const int64_t *)rows.ints : NULL;
    if (q.dims[1] != 1 || memcmp(q.dims, key.dims, 3 * sizeof(int64_t)) || memcmp(q.dims, value.dims, 3 * sizeof(int64_t)) ||
        (with_rows ? rows.dims[0] != batch : past_rows != batch) || past_k.dims[1] != heads || heads * dim != width ||
        memcmp(past_k.dims, past_v.dims, sizeof past_k.dims) || past + 1 > MAX_KEYS)
        return fail("tk.kernels.SelfAttention: the query, key, value and past do not agree in shape (one new position a row)");
    for (int64_t b = 0; from && b < batch; b++)
        if (from[b] < 0 || from[b] >= past_rows) return fail("tk.kernels.SelfAttentionRows: a row of the past out of range");
    float *out, *present_k, *present_v;
    int64_t present_dims[4] = {batch, heads, past + 1, dim};
    if ((status = output(context, 0, q.dims, 3, &out)) || (status = output(context, 1, present_dims, 4, &present_k)) ||
        (status = output(context, 2, present_dims, 4, &present_v)))
        return status;
    float scores[past + 1];
    for (int64_t b = 0; b < batch; b++) {
        int64_t source = from ? from[b] : b;
        for (int64_t h = 0; h < heads; h++) {
            int64_t block = (b * heads + h), at = b * width + h * dim, past_block = source * heads + h;
            float *pk = present_k + block * (past + 1) * dim, *pv = present_v + block * (past + 1) * dim;
            memcpy(pk, past_k.data + past_block * past * dim, past * dim * sizeof(float));
            memcpy(pv, past_v.data + past_block * past * dim, past * dim * sizeof(float));
            memcpy(pk + past * dim, key.data + at, dim * sizeof(float));
            memcpy(pv + past * dim, value.data + at, dim * sizeof(float));
            attend_row(q.data + at, pk, pv, past + 1, dim, k->scale, out + at, scores);
        }
    }
    return NULL;
}

static OrtStatus *self_compute(void *kernel, OrtKernelContext *context) { return self_attend(kernel, context, 0); }
static OrtStatus *self_rows_compute(void *kernel, OrtKernelContext *context) { return self_attend(kernel, context, 1); }

/* The k largest of n values, largest first, equal values in index order (ONNX TopK's order, sorted, largest).
 * A threshold first: the k-th largest of the maxima of disjoint groups of values is at most the k-th largest value (k
 * groups each hold one at least as large), so only values at or above it can rank; then one pass in index order that inserts
 * those, a value entering only where it beats the one before it. Both passes are vector compares over the row. */
#define MAX_BLOCKS 16384  /* groups a row's threshold pass takes (NLLB's 256,206 ids: 16,013): 64 KiB on the stack */
#define MAX_THRESHOLD_K 256  /* a larger k (never a beam's) ranks by insertion alone, with nothing more on the stack */

static inline void insert_ranked(float v, int64_t id, int64_t k, int64_t *filled, float *restrict best,
                                 int64_t *restrict ids) {
    if (*filled == k && !(v > best[k - 1])) return;
    int64_t p = *filled < k ? (*filled)++ : k - 1;
    while (p > 0 && v > best[p - 1]) {
        best[p] = best[p - 1], ids[p] = ids[p - 1];
        p--;
    }
    best[p] = v, ids[p] = id;
}

static void top_k_row(const float *restrict x, int64_t n, int64_t k, float *restrict best, int64_t *restrict ids) {
    /* The groups: in each stretch of 256 values, the 16 values at each of the 16 places of a vector (their maxima
     * are 16 vector maxima, one per step down the stretch); a row's last partial stretch is in no group. */
    int64_t stretches = n / (LANES * LANES), groups = stretches * LANES, filled = 0;
    float threshold = -INFINITY;
    if (groups >= k && groups <= MAX_BLOCKS && k <= MAX_THRESHOLD_K) {
        float maxima[MAX_BLOCKS], kth[k];
        for (int64_t c = 0; c < stretches; c++) {
            const float *restrict at = x + c * LANES * LANES;
            float m[LANES];
            for (int l = 0; l < LANES; l++) m[l] = at[l];
            for (int j = 1; j < LANES; j++)
#pragma omp simd
                for (int l = 0; l < LANES; l++) m[l] = at[j * LANES + l] > m[l] ? at[j * LANES + l] : m[l];
            for (int l = 0; l < LANES; l++) maxima[c * LANES + l] = m[l];
        }
        int64_t count = 0, unused[k];
        for (int64_t g = 0; g < groups; g++) insert_ranked(maxima[g], g, k, &count, kth, unused);
        threshold = count == k ? kth[k - 1] : -INFINITY;
        if (threshold != threshold) threshold = -INFINITY;  /* NaN */
    }
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int l = 0; l < LANES; l++) any |= x[i + l] >= threshold;
        if (!any) continue;
        for (int64_t j = i; j < i + LANES; j++)
            if (x[j] >= threshold) insert_ranked(x[j], j, k, &filled, best, ids);
    }
    for (; i < n; i++)
        if (x[i] >= threshold) insert_ranked(x[i], i, k, &filled, best, ids);
    for (; filled < k; filled++) best[filled] = -INFINITY, ids[filled] = 0;  /* only a row of NaN gets here */
}

static OrtStatus *top_k_compute(void *kernel, OrtKernelContext *context) {
    (void)kernel;
    Tensor x, count;
    OrtStatus *status;
    if ((status = input(context, 0, &x)) || (status = input(context, 1, &count))) return status;
    if (x.rank != 2 || count.rank != 1 || count.dims[0] != 1)
        return fail("tk.kernels.TopK: expected values [R, N] and k [1]");
    int64_t rows = x.dims[0], n = x.dims[1], k = ((const int64_t *)count.ints)[0];
    if (k < 1 || k > n) return fail("tk.kernels.TopK: k must be between 1 and the row's length");
    int64_t dims[2] = {rows, k};
    float *best;
    int64_t *ids;
    if ((status = output(context, 0, dims, 2, &best)) || (status = output(context, 1, dims, 2, &ids))) return status;
    for (int64_t r = 0; r < rows; r++) top_k_row(x.data + r * n, n, k, best + r * k, ids + r * k);
    return NULL;
}

static const char *cross_name(const CustomOp *op) { (void)op; return "CrossAttention"; }
static const char *self_name(const CustomOp *op) { (void)op; return "SelfAttention"; }
static const char *self_rows_name(const CustomOp *op) { (void)op; return "SelfAttentionRows"; }
static int self_rows_type(const CustomOp *op, size_t i) { (void)op; return i == 5 ? TYPE_INT64 : TYPE_FLOAT; }
static size_t six(const CustomOp *op) { (void)op; return 6; }
static const char *top_k_name(const CustomOp *op) { (void)op; return "TopK"; }
static int top_k_type(const CustomOp *op, size_t i) { (void)op; return i == 1 ? TYPE_INT64 : TYPE_FLOAT; }
static size_t two(const CustomOp *op) { (void)op; return 2; }
static const char *provider(const CustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int cross_input_type(const CustomOp *op, size_t i) { (void)op; return i == 3 ? TYPE_INT32 : TYPE_FLOAT; }
static int float_type(const CustomOp *op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static size_t four(const CustomOp *op) { (void)op; return 4; }
static size_t five(const CustomOp *op) { (void)op; return 5; }
static size_t one(const CustomOp *op) { (void)op; return 1; }
static size_t three(const CustomOp *op) { (void)op; return 3; }
static int required(const CustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int default_memory(const CustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int min_arity(const CustomOp *op) { (void)op; return 1; }
static int homogeneous(const CustomOp *op) { (void)op; return 0; }

#define OP(name_fn, input_type_fn, inputs, output_type_fn, outputs, create, compute)                                    \
    {API_VERSION, NULL, name_fn, provider, input_type_fn, inputs, output_type_fn, outputs, NULL, destroy_kernel, required, \
     required, default_memory, min_arity, homogeneous, min_arity, homogeneous, create, compute}

static const CustomOp cross_op = OP(cross_name, cross_input_type, four, float_type, one, create_kernel, cross_compute);
static const CustomOp self_op = OP(self_name, float_type, five, float_type, three, create_kernel, self_compute);
static const CustomOp self_rows_op = OP(self_rows_name, self_rows_type, six, float_type, three, create_kernel, self_rows_compute);
static const CustomOp top_k_op = OP(top_k_name, top_k_type, two, top_k_type, two, create_plain, top_k_compute);

static OrtCustomOpDomain *domain;
static OrtStatus *domain_status;
static pthread_once_t domain_once = PTHREAD_ONCE_INIT;

static void make_domain(void) {
    if ((domain_status = FN(CreateDomainFn, CREATE_CUSTOM_OP_DOMAIN)("tk.kernels", &domain))) return;
    if ((domain_status = FN(DomainAddFn, CUSTOM_OP_DOMAIN_ADD)(domain, &cross_op))) return;
    if ((domain_status = FN(DomainAddFn, CUSTOM_OP_DOMAIN_ADD)(domain, &self_op))) return;
    if ((domain_status = FN(DomainAddFn, CUSTOM_OP_DOMAIN_ADD)(domain, &self_rows_op))) return;
    domain_status = FN(DomainAddFn, CUSTOM_OP_DOMAIN_ADD)(domain, &top_k_op);
}

/* The entry point ONNX Runtime calls when a session's options register this library. One domain serves every
 * session of the process (it must outlive them: it is never freed). */
OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    if (!api) api = base->GetApi(API_VERSION);
    if (!api) return NULL;  /* an ONNX Runtime older than 1.16: nothing registered, and the graph's load says so */
    pthread_once(&domain_once, make_domain);
    if (domain_status) return fail("tk.kernels: could not make the custom operator domain");
    return FN(AddDomainFn, ADD_CUSTOM_OP_DOMAIN)(options, domain);
}
