// Defined by FusedStep: T, V (16 bytes of T: float4 or double2), VEC (Ts in a V), C (classes), HW
// (the row length of hw, FusedStep's copy of W2^T and b1: C + 1 rounded up to whole Vs), and the
// block shapes. For z1 row-major (n x H; *_rows kernels): THREADS, OUT_ROWS (rows per block of
// output_layer_rows) and HID_ROWS (rows per block of hidden_grad_rows). For z1 transposed (zt:
// H x ld, sample r of hidden unit h at h ld + r; *_t kernels, which read and write along
// samples): OUT_WARPS and OUT_UNROLL (output_layer_t's warps per block of 32 samples, and the
// rows each warp loads at once); HID_WARPS, HID_H, HID_S and HID_MIN_BLOCKS (hidden_grad_t's
// warps, hidden units and samples per block, and the blocks per SM its registers must allow).

__device__ inline float tf32(float x) {  // round to the nearest TF32 value (10-bit mantissa)
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}
__device__ inline double tf32(double x) { return x; }  // float64 is never split

// 1 / (1 + e^-z). In float32 the reciprocal of x = 1 + e^-z is the fast path of CUDA's IEEE
// division (MUFU.RCP and one Newton step) without its test and branch to the slow path, which x
// never needs once z >= -87 (x < 2^126; below -87, a = 1.6e-38 instead of less; NaN stays NaN):
// the bits of 1.f / (1.f + expf(-z)) for every float32 z in [-87, 88] (the old BENCHMARKS.md, in git history), in fewer
// instructions. __expf would save a few more at a few ulps.
__device__ inline float sigmoid(float z) {
    const float x = 1.f + exp(-(z < -87.f ? -87.f : z));
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return fmaf(r, -fmaf(x, r, -1.f), r);
}
__device__ inline double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

// BF16 (bfloat16) is a float32's top 16 bits: b16 keeps them (truncating), b16_rn rounds to nearest.
__device__ inline unsigned short b16(float v) { return (unsigned short)(__float_as_uint(v) >> 16); }
__device__ inline unsigned short b16_rn(float v) { return (unsigned short)((__float_as_uint(v) + 0x8000u) >> 16); }
__device__ inline float f32(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }

// v as three BF16 parts, small first: out[0] = lo, out[1] = mid, out[2] = hi (v = hi + mid + lo
// to about 2^-24 relative: hi and mid truncated, so the rests are exact, lo rounded).
__device__ inline void bf16_parts(const float v, unsigned short out[3]) {
    out[2] = b16(v);
    const float r = v - f32(out[2]);
    out[1] = b16(r);
    out[0] = b16_rn(r - f32(out[1]));
}

// v into `parts` places `stride` apart (P: the GEMMs' operand type, T or BF16's unsigned short).
// One part: v itself. TF32: hi = v rounded to TF32 in every place but lo_at, which gets lo = v - hi
// rounded (lo_at < 0: hi in all, for v an integer level that TF32 holds exactly: hi = v). BF16:
// [lo | mid | hi] (lo_at < 0: v in all, an integer level that BF16 holds exactly).
__device__ inline void put_parts(P* at, const long long stride, const int parts, const T v, const int lo_at) {
#if BF16
    unsigned short q[3];
    bf16_parts(v, q);
    for (int p = 0; p < parts; ++p) at[p * stride] = lo_at < 0 ? q[2] : q[p];
#else
    if (parts == 1) {
        at[0] = v;
        return;
    }
    const T hi = tf32(v), lo = tf32(v - hi);
    for (int p = 0; p < parts; ++p) at[p * stride] = p == lo_at ? lo : hi;
#endif
}

// VEC consecutive values v[0..VEC) of one row as put_parts does, VEC at a time: each part's VEC
// values go out in one store (one V; BF16: VEC = 4 16-bit values, 8 bytes), so `at` must be
// aligned to that store. Only for the parts of W1 and dz1: BF16's three [lo | mid | hi] (lo_at
// and parts unused), TF32's as put_parts (lo_at >= 0). Every array index is known at compile time
// once unrolled: a runtime one puts q in local memory (the hidden gradient took 52 us, not 32).
__device__ inline void put_parts_vec(P* at, const long long stride, const int parts, const T* v, const int lo_at) {
#if BF16
    unsigned short q[VEC][3];
#pragma unroll
    for (int i = 0; i < VEC; ++i) bf16_parts(v[i], q[i]);
#pragma unroll
    for (int p = 0; p < 3; ++p) {
        const uint2 four = {q[0][p] | ((unsigned)q[1][p] << 16), q[2][p] | ((unsigned)q[3][p] << 16)};
        *reinterpret_cast<uint2*>(at + p * stride) = four;
    }
#else
    V hv, lv;
    T *hi = reinterpret_cast<T*>(&hv), *lo = reinterpret_cast<T*>(&lv);
    if (parts == 1) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) hi[i] = v[i];
        *reinterpret_cast<V*>(at) = hv;
        return;
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        hi[i] = tf32(v[i]);
        lo[i] = tf32(v[i] - hi[i]);
    }
    for (int p = 0; p < parts; ++p) *reinterpret_cast<V*>(at + p * stride) = p == lo_at ? lv : hv;
#endif
}

extern "C" __global__ void split_tf32(const T* x, const int rows, const int d, const int parts, const int lo_at,
                                      P* out) {
    // out (rows x parts d) <- each row of x (rows x d) as its TF32 parts, side by side (put_parts).
    const long long total = (long long)rows * d;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        const long long r = k / d, j = k - r * d;
        put_parts(out + r * parts * d + j, d, parts, x[k], lo_at);
    }
}

extern "C" __global__ void prepare_x(const T* __restrict__ x, const int n, const int d, const int parts,
                                     const T levels, P* __restrict__ xcat, P* __restrict__ xt, const int ld,
                                     const int part) {
    // The batch's X (n x d) as the GEMMs read it: X^T into xt (row stride ld) for dW1, whose
    // operands must both be K-major: xt[c, r] = X[r, c]. With parts > 1 (float32 accuracy on
    // tensor cores), each value as `parts` TF32 (or BF16) values, into xcat (n x parts d, side by side) for
    // z1 and into xt in column blocks `part` apart: if levels > 0, X's pixels are k / levels with
    // k an integer, exact in TF32 (and BF16), so k in every place; else [lo | hi | hi]. The grid covers the
    // rows to a multiple of 32; rows past n get zeros. Block: 32 x 8 threads, a 32 x 32 tile
    // through shared memory (reads and writes coalesced).
    __shared__ T tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32, tx = threadIdx.x, lo_at = levels > 0 ? -1 : 0;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + tx;
        T v = 0;
        if (r < n && c < d) {
            v = x[(long long)r * d + c];
            if (levels > 0) v = rint(v * levels);
            if (parts > 1) put_parts(xcat + (long long)r * parts * d + c, d, parts, v, lo_at);
        }
        tile[i][tx] = v;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32 && c0 + i < d; i += 8)  // X[r0 + tx, c0 + i]
        put_parts(xt + (long long)(c0 + i) * ld + r0 + tx, part, parts, tile[tx][i], lo_at);
}

extern "C" __global__ void output_layer_rows(const T* __restrict__ z1, const T* __restrict__ hw,
                                             const T* __restrict__ b2, const long long* y, const int n, const int H,
                                             T* e, T* ce_sum) {
    // Row-major z1 (n x H, without b1): a block takes OUT_ROWS rows at a time, its THREADS threads
    // splitting the H columns: a = sigmoid(z1 + b1), z2 = a W2^T + b2 (row h of hw holds W2[:, h]
    // and b1[h]); writes e = softmax(z2) - onehot(y) (n x C) and adds its rows' cross-entropies
    // to ce_sum[0] (zeroed by the caller).
    __shared__ T part[32][OUT_ROWS][C];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    T loss = 0;  // warp 0's
    for (int r0 = blockIdx.x * OUT_ROWS; r0 < n; r0 += gridDim.x * OUT_ROWS) {
        T acc[OUT_ROWS][C];
        for (int i = 0; i < OUT_ROWS; ++i)
            for (int c = 0; c < C; ++c) acc[i][c] = 0;
#pragma unroll 2
        for (int h = threadIdx.x; h < H; h += blockDim.x) {
            V wv[HW / VEC];  // W2[:, h] and b1[h] in HW / VEC vector loads, not C + 1 scalar ones
            for (int v = 0; v < HW / VEC; ++v) wv[v] = reinterpret_cast<const V*>(hw + (long long)h * HW)[v];
            const T* w = reinterpret_cast<const T*>(wv);
            T a[OUT_ROWS];
            for (int i = 0; i < OUT_ROWS; ++i)
                a[i] = r0 + i < n ? sigmoid(z1[(long long)(r0 + i) * H + h] + w[C]) : (T)0;
            for (int c = 0; c < C; ++c)
                for (int i = 0; i < OUT_ROWS; ++i) acc[i][c] += a[i] * w[c];
        }
        for (int i = 0; i < OUT_ROWS; ++i)
            for (int c = 0; c < C; ++c) {
                T v = acc[i][c];
                for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
                if (lane == 0) part[warp][i][c] = v;
            }
        __syncthreads();
        for (int i = 0; warp == 0 && i < OUT_ROWS && r0 + i < n; ++i) {  // lane c < C: logit c of row r0 + i
            const int r = r0 + i, yi = (int)y[r];
            T z = 0;
            if (lane < C) {
                z = b2[lane];
                for (int w = 0; w < warps; ++w) z += part[w][i][lane];
            }
            T m = __shfl_sync(0xffffffff, z, 0);  // lanes >= C hold no logit: start them at logit 0
            if (lane < C) m = z;
            for (int off = 16; off > 0; off >>= 1) {
                const T o = __shfl_xor_sync(0xffffffff, m, off);
                m = o > m ? o : m;
            }
            T p = lane < C ? exp(z - m) : (T)0, s = p;
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
            if (lane < C) e[(long long)r * C + lane] = p / s - (lane == yi ? (T)1 : (T)0);
            if (lane == yi) loss += log(s) + m - z;  // -log softmax(z2)_y
        }
        __syncthreads();  // part is refilled for the next rows
    }
    if (warp == 0) {
        for (int off = 16; off > 0; off >>= 1) loss += __shfl_xor_sync(0xffffffff, loss, off);
        if (lane == 0) atomicAdd(ce_sum, loss);
    }
}

extern "C" __global__ void hidden_grad_rows(T* z1, const T* __restrict__ b1, const T* __restrict__ W2,
                                            const T* __restrict__ e, const int n, const int H, const T scale,
                                            T* gb1, T* gW2, T* gb2) {
    // Row-major z1 (n x H). Thread: column h of HID_ROWS rows (rows past n count as zeros). With
    // a = sigmoid(z1 + b1): dz1 = scale (e W2) a (1 - a), written over z1; and the block's sums
    // over its rows added to the gradient (zeroed by the caller): db1 += sum dz1, dW2 += scale
    // e^T a, db2 += scale sum e (blocks of the first column tile).
    __shared__ T es[HID_ROWS * C];
    const int r0 = blockIdx.y * HID_ROWS, rows = min(HID_ROWS, max(0, n - r0));
    for (int k = threadIdx.x; k < rows * C; k += blockDim.x) es[k] = e[(long long)r0 * C + k];
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x < C) {
        T s = 0;
        for (int r = 0; r < rows; ++r) s += es[r * C + threadIdx.x];
        atomicAdd(gb2 + threadIdx.x, scale * s);
    }
    const int h = blockIdx.x * THREADS + threadIdx.x;
    if (h >= H) return;
    T w[C], acc[C];
    for (int c = 0; c < C; ++c) { w[c] = W2[(long long)c * H + h]; acc[c] = 0; }
    const T bh = b1[h];
    T db = 0;
#pragma unroll 4
    for (int r = 0; r < HID_ROWS; ++r) {
        if (r >= rows) break;
        const long long k = (long long)(r0 + r) * H + h;
        const T a = sigmoid(z1[k] + bh);
        T da = 0;
        for (int c = 0; c < C; ++c) {
            const T ec = es[r * C + c];
            da += ec * w[c];
            acc[c] += a * ec;
        }
        const T d = scale * da * a * ((T)1 - a);
        db += d;
        z1[k] = d;
    }
    atomicAdd(gb1 + h, db);
    for (int c = 0; c < C; ++c) atomicAdd(gW2 + (long long)c * H + h, scale * acc[c]);
}

// One element of output_layer_t: a = sigmoid(z + b1[h]), stored at `at` (for hidden_grad_t) if
// `store`, and acc += a W2[:, h] (wv: row h of hw).
__device__ inline void out_row(const V* wv, const T z, T* at, const bool store, T acc[C]) {
    const T* w = reinterpret_cast<const T*>(wv);
    const T a = sigmoid(z + w[C]);
    if (store) *at = a;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] += a * w[c];
}

extern "C" __global__ void __launch_bounds__(32 * OUT_WARPS)
output_layer_t(T* __restrict__ zt, const int ld, const T* __restrict__ hw, const T* __restrict__ b2,
               const long long* __restrict__ y, const int n, const int H, T* __restrict__ et, const int estride,
               T* ce_sum) {
    // z1^T is zt's first n columns (H x n, row stride ld, without b1). Block (32 x OUT_WARPS
    // threads): the OUT_S samples (32 or 16) from s0 = OUT_S blockIdx.x against every hidden unit:
    // lane l takes sample s0 + l % OUT_S of the rows h with h % RW = l / OUT_S (RW = 32 / OUT_S
    // rows a warp loads at once; warp w every OUT_WARPS RW-th from w RW, OUT_UNROLL at once;
    // W2[:, h] and b1[h], row h of hw): z2 = a W2^T + b2, a = sigmoid(z1 + b1), and a^T written over
    // z1^T (hidden_grad_t reads it: one store an element here, one sigmoid less there; the old BENCHMARKS.md, in git history).
    // Writes e^T = (softmax(z2) - onehot(y))^T into et (C x estride, zeros past n) and adds the
    // rows' cross-entropies to ce_sum[0] (zeroed by the caller). The whole H in one block: the
    // warps' sums meet in shared memory, not across blocks.
    __shared__ T part[OUT_WARPS][C][32];  // the warps' logits of the block's samples, lane by lane
    constexpr int RW = 32 / OUT_S, STEP = OUT_WARPS * RW;  // rows per warp, per pass of the block
    const int lane = threadIdx.x, warp = threadIdx.y, r = blockIdx.x * OUT_S + lane % OUT_S;
    // The lane's rows h0, h0 + STEP, ... walked with pointers, whole groups of OUT_UNROLL first:
    // with z1^T in L2 the kernel is bound by issuing instructions, and 64-bit indices and per-row
    // masks were half of them (75 a float32 element, now 35; the old BENCHMARKS.md, in git history). In the step z1^T
    // comes partly from memory: the rows OUT_PREFETCH ahead are prefetched into L2. Lanes past n
    // read their column (inside ld) and store nothing.
    const int h0 = warp * RW + lane / OUT_S, rows = h0 < H ? (H - 1 - h0) / STEP + 1 : 0;
    const long long zs = (long long)STEP * ld;
    constexpr int WS = STEP * HW / VEC;  // hw's rows, in Vs
    T* zp = zt + (long long)h0 * ld + r;
    const V* wp = reinterpret_cast<const V*>(hw) + (long long)h0 * (HW / VEC);  // W2[:, h], b1[h]: HW / VEC loads
    const bool store = r < n;
    T acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] = 0;
    int k = 0;
    for (; k + OUT_UNROLL <= rows; k += OUT_UNROLL, zp += OUT_UNROLL * zs, wp += OUT_UNROLL * WS) {
        V wv[OUT_UNROLL][HW / VEC];
        T z[OUT_UNROLL];
#pragma unroll
        for (int u = 0; u < OUT_UNROLL; ++u) {  // every load first: OUT_UNROLL rows in flight
#pragma unroll
            for (int v = 0; v < HW / VEC; ++v) wv[u][v] = wp[u * WS + v];
            z[u] = zp[u * zs];
            if (OUT_PREFETCH && k + OUT_PREFETCH + u < rows)  // into L2, no register held: more bytes in flight
                asm volatile("prefetch.global.L2 [%0];" ::"l"(zp + (OUT_PREFETCH + u) * zs));
        }
#pragma unroll
        for (int u = 0; u < OUT_UNROLL; ++u) out_row(wv[u], z[u], zp + u * zs, store, acc);
    }
    for (; k < rows; ++k, zp += zs, wp += WS) {
        V wv[HW / VEC];
#pragma unroll
        for (int v = 0; v < HW / VEC; ++v) wv[v] = wp[v];
        out_row(wv, *zp, zp, store, acc);
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        for (int off = 16; off >= OUT_S; off >>= 1) acc[c] += __shfl_down_sync(0xffffffff, acc[c], off);
        part[warp][c][lane] = acc[c];  // lanes past OUT_S: partial sums, not read
    }
    __syncthreads();
    if (warp < C) {  // warp c: logit c of the block's samples
        T z = b2[warp];
        for (int w = 0; w < OUT_WARPS; ++w) z += part[w][warp][lane];
        part[0][warp][lane] = z;
    }
    __syncthreads();
    if (warp > 0) return;
    const bool mine = lane < OUT_S;  // lanes past OUT_S repeat samples: they write nothing
    T z[C], m, s = 0, zy = 0;
    const int yr = r < n ? (int)y[r] : -1;
#pragma unroll
    for (int c = 0; c < C; ++c) z[c] = part[0][c][lane];
    m = z[0];
#pragma unroll
    for (int c = 1; c < C; ++c) m = z[c] > m ? z[c] : m;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        s += exp(z[c] - m);
        zy = c == yr ? z[c] : zy;
    }
    T loss = mine && r < n ? log(s) + m - zy : (T)0;  // -log softmax(z2)_y
#pragma unroll
    for (int c = 0; c < C; ++c)
        if (mine) et[(long long)c * estride + r] = r < n ? exp(z[c] - m) / s - (c == yr ? (T)1 : (T)0) : (T)0;
    for (int off = 16; off > 0; off >>= 1) loss += __shfl_xor_sync(0xffffffff, loss, off);
    if (lane == 0) atomicAdd(ce_sum, loss);
}

extern "C" __global__ void __launch_bounds__(32 * HID_WARPS, HID_MIN_BLOCKS)
hidden_grad_t(T* zt, const int ld, const T* __restrict__ hw, const T* __restrict__ et, const int estride,
              const int n, const int H, const T scale, const int parts, const int lo_at, const int part, P* dp,
              const int dld, T* gb1, T* gW2, T* gb2) {
    // Block (32 x HID_WARPS threads): the HID_S samples (a multiple of 32 VEC) from s0 = blockIdx.y
    // HID_S (lane l: VEC at a time, read and written as one V) of the hidden units [h0, h0 +
    // HID_H), h0 = blockIdx.x HID_H (warp w: every HID_WARPS-th from h0 + w). With a^T in zt
    // (a = sigmoid(z1 + b1), written over z1^T by output_layer_t; row stride ld): dz1 = scale (e
    // W2) a (1 - a), written over a^T for samples r < part (zeros from n on); with parts > 1, as
    // that many TF32 parts in column blocks `part` apart, lo in block lo_at and hi in the others
    // (dW1's K-major operand, put_parts); with BF16 the parts [lo | mid | hi] go to dp (row
    // stride dld), not over a^T. Each warp adds its sums over its samples to the gradient (zeroed
    // by the caller): db1 += sum dz1, dW2 += scale e^T a, and the blocks of the first hidden units
    // db2 += scale sum e.
    __shared__ __align__(16) T es[C][HID_S];  // e^T of the block's samples, zeros past n
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int s0 = blockIdx.y * HID_S, h0 = blockIdx.x * HID_H;
    for (int k = warp * 32 + lane; k < C * HID_S; k += 32 * HID_WARPS) {
        const int c = k / HID_S, s = k - c * HID_S;
        es[c][s] = s0 + s < n ? et[(long long)c * estride + s0 + s] : (T)0;
    }
    __syncthreads();
    for (int c = warp; blockIdx.x == 0 && c < C; c += HID_WARPS) {
        T sum = 0;
        for (int s = lane; s < HID_S; s += 32) sum += es[c][s];
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, off);
        if (lane == 0) atomicAdd(gb2 + c, scale * sum);
    }
    for (int h = h0 + warp; h < min(H, h0 + HID_H); h += HID_WARPS) {
        V wv[HW / VEC];
#pragma unroll
        for (int v = 0; v < HW / VEC; ++v) wv[v] = reinterpret_cast<const V*>(hw + (long long)h * HW)[v];
        const T* w = reinterpret_cast<const T*>(wv);
        T acc[C], db = 0;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = 0;
        T* row = zt + (long long)h * ld + s0;
        V zv[HID_S / (32 * VEC)];  // every load first: the row's samples of this lane in flight at once
#pragma unroll
        for (int k = 0; k < HID_S / (32 * VEC); ++k) {
            const int s = VEC * (32 * k + lane);
            zv[k] = {};
            if (s0 + s < n) zv[k] = *reinterpret_cast<const V*>(row + s);
        }
#pragma unroll
        for (int k = 0; k < HID_S / (32 * VEC); ++k) {
            const int s = VEC * (32 * k + lane), r = s0 + s;
            if (r >= part) break;
            const T* z = reinterpret_cast<const T*>(&zv[k]);
            T a[VEC], da[VEC], d[VEC];
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                a[i] = r + i < n ? z[i] : (T)0;  // 0: no dz1, no dW2 term
                da[i] = 0;
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const V ev = *reinterpret_cast<const V*>(&es[c][s]);  // one 16-byte load: no bank conflicts
                const T* e = reinterpret_cast<const T*>(&ev);
#pragma unroll
                for (int i = 0; i < VEC; ++i) {
                    da[i] += e[i] * w[c];
                    acc[c] += a[i] * e[i];
                }
            }
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                d[i] = scale * da[i] * a[i] * ((T)1 - a[i]);
                db += d[i];
            }
            // BF16: the parts to dp; else over a^T, where they were read
            put_parts_vec(BF16 ? dp + (long long)h * dld + s0 + s : (P*)(row + s), part, parts, d, lo_at);
        }
        for (int off = 16; off > 0; off >>= 1) {
            db += __shfl_xor_sync(0xffffffff, db, off);
#pragma unroll
            for (int c = 0; c < C; ++c) acc[c] += __shfl_xor_sync(0xffffffff, acc[c], off);
        }
        if (lane == 0) {
            atomicAdd(gb1 + h, db);
#pragma unroll
            for (int c = 0; c < C; ++c) atomicAdd(gW2 + (long long)c * H + h, scale * acc[c]);
        }
    }
}

extern "C" __global__ void sgd_update(T* p, const T* g, const long long begin, const long long end,
                                      const long long w1_end, const long long w2_begin, const long long w2_end,
                                      const T lr, const T reg, const T* ce_sum, const T inv_batch, T* loss_out,
                                      const int parts, const int lo_at, const int D, P* w1cat, T* hw) {
    // p[k] <- p[k] - lr (g[k] + reg W) for k in [begin, end) (biases: no reg). loss_out[0] +=
    // reg/2 ||W||^2 over these weights before the update, and inv_batch * ce_sum[0] unless ce_sum
    // is null; loss_out must start at 0. The new b1 and W2 also go into hw (H x HW) for
    // output_layer; with parts > 1, the new W1 into w1cat (H x parts D) as its TF32 (or BF16)
    // parts, lo in block lo_at (put_parts), for the next forward's split GEMM. [begin, end) starts
    // on a row of W1 (FusedStep cuts on rows). W1's rows go a V at a time when D is a multiple of
    // VEC (a V never straddles two rows): one 16-byte load or store per V instead of VEC, and one
    // division by D per V (H=2048, bf16x3: 9.8 us, against 13.6 one value a thread; the old BENCHMARKS.md, in git history).
    T pen = 0;
    const long long first = begin + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long rest = begin;  // where the scalar loop starts
    const bool aligned = ((unsigned long long)p | (unsigned long long)g | (unsigned long long)w1cat) % 16 == 0;
    if (D % VEC == 0 && aligned && begin < w1_end) {
        const long long v_end = (min(end, w1_end) - begin) / VEC;  // whole rows: a multiple of D / VEC
        for (long long i = first - begin; i < v_end; i += stride) {
            const long long k = begin + i * VEC;
            const V wv = *reinterpret_cast<const V*>(p + k), gv = *reinterpret_cast<const V*>(g + k);
            const T *w = reinterpret_cast<const T*>(&wv), *gk = reinterpret_cast<const T*>(&gv);
            V nv;
            T* v = reinterpret_cast<T*>(&nv);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                pen += w[j] * w[j];
                v[j] = w[j] - lr * (gk[j] + reg * w[j]);
            }
            *reinterpret_cast<V*>(p + k) = nv;
            if (parts > 1) {
                const long long row = k / D;
                put_parts_vec(w1cat + row * parts * D + (k - row * D), D, parts, v, lo_at);
            }
        }
        rest = min(end, w1_end);
    }
    for (long long k = rest + first - begin; k < end; k += stride) {
        const T w = p[k];
        T gk = g[k];
        if (k < w1_end || (k >= w2_begin && k < w2_end)) { pen += w * w; gk += reg * w; }
        const T v = w - lr * gk;
        p[k] = v;
        if (parts > 1 && k < w1_end) {
            const long long row = k / D;
            put_parts(w1cat + row * parts * D + (k - row * D), D, parts, v, lo_at);
        } else if (k >= w1_end && k < w2_end) {  // b1 (H values) or W2 (C x H)
            const long long H = w2_begin - w1_end, j = k - w1_end, c = j / H - 1, h = j - (c + 1) * H;
            hw[h * HW + (c < 0 ? C : c)] = v;
        }
    }
    __shared__ T part[32];
    for (int off = 16; off > 0; off >>= 1) pen += __shfl_down_sync(0xffffffff, pen, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = pen;
    __syncthreads();
    if (threadIdx.x == 0) {
        T total = 0;
        for (int w = 0; w < blockDim.x / 32; ++w) total += part[w];
        total *= reg / 2;
        if (blockIdx.x == 0 && ce_sum) total += inv_batch * ce_sum[0];
        atomicAdd(loss_out, total);
    }
}
