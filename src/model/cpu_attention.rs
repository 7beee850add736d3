//! Causal self-attention for the CPU backend.
//!
//! Burn's CPU (flex) attention runs one (batch, head) at a time on one
//! thread and computes the whole score square before masking it. On a 2-core
//! machine that made attention a third of a decoder layer's time at seqlen
//! 512, and most of it at 2048. This kernel:
//! - works in blocks of 64 query rows and only multiplies the keys a block
//!   can see (the causal lower triangle, and Mistral's window);
//! - reads `q` as `[batch, seq, heads, head_dim]` and `k`/`v` as
//!   `[batch, seq, kv_heads, head_dim]` (the layout the projections produce)
//!   and writes `[batch, seq, heads, head_dim]` (the layout `o_proj` reads), so
//!   no transposing copies and no repeated K/V for grouped-query heads;
//! - runs blocks in parallel on rayon, with the score and value products in
//!   `gemm` and a vectorised `exp` in the softmax.
//!
//! It computes softmax(q·kᵀ/√d)·v in f32 exactly as the reference does up to
//! rounding (`exp` is a degree-7 polynomial, within 2 ulp of `expf`).

use rayon::prelude::*;

const BLOCK: usize = 64;

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Keys at least this many positions back are hidden (sliding window).
    pub window: Option<usize>,
}

struct SyncPtr(*mut f32);
// SAFETY: every task writes a disjoint set of output rows (its own query
// block of its own heads); see `attention`.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// Through a method, so closures capture the `Sync` wrapper rather than
    /// the raw pointer field.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// `dst[m×n] = lhs[m×k] · rhs[k×n]` with explicit strides, single-threaded
/// (parallelism comes from running blocks concurrently).
#[allow(clippy::too_many_arguments)]
unsafe fn mm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: isize,
    lhs: *const f32,
    lhs_rs: isize,
    lhs_cs: isize,
    rhs: *const f32,
    rhs_rs: isize,
    rhs_cs: isize,
) {
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs,
            false,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Causal attention. `q`: `[batch, seq, heads, head_dim]`; `k`, `v`:
/// `[batch, seq, kv_heads, head_dim]`; returns `[batch, seq, heads, head_dim]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], shape: AttentionShape) -> Vec<f32> {
    let AttentionShape {
        batch,
        seq,
        heads,
        kv_heads,
        head_dim: d,
        window,
    } = shape;
    assert_eq!(q.len(), batch * seq * heads * d, "q shape");
    assert_eq!(k.len(), batch * seq * kv_heads * d, "k shape");
    assert_eq!(v.len(), batch * seq * kv_heads * d, "v shape");
    assert!(
        kv_heads > 0 && heads % kv_heads == 0,
        "heads must be a multiple of kv_heads"
    );
    let rep = heads / kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let blocks = seq.div_ceil(BLOCK);
    let q_rs = (heads * d) as isize;
    let kv_rs = (kv_heads * d) as isize;

    let tasks: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|b| (0..kv_heads).flat_map(move |g| (0..blocks).map(move |blk| (b, g, blk))))
        .collect();
    tasks.into_par_iter().for_each_init(
        || vec![0f32; BLOCK * seq],
        |scores, (b, g, blk)| {
            let r0 = blk * BLOCK;
            let r1 = (r0 + BLOCK).min(seq);
            let rows = r1 - r0;
            // Keys visible to this block: [k0, r1).
            let k0 = window.map_or(0, |w| (r0 + 1).saturating_sub(w));
            let kv_len = r1 - k0;
            let kv_base = (b * seq + k0) * kv_heads * d + g * d;
            for h in g * rep..(g + 1) * rep {
                let q_base = (b * seq + r0) * heads * d + h * d;
                let sc = &mut scores[..rows * kv_len];
                // SAFETY: pointers and strides stay inside q, k, v and the
                // scratch buffer for the given m, n, k.
                unsafe {
                    mm(
                        rows,
                        kv_len,
                        d,
                        sc.as_mut_ptr(),
                        kv_len as isize,
                        q.as_ptr().add(q_base),
                        q_rs,
                        1,
                        k.as_ptr().add(kv_base),
                        1,
                        kv_rs,
                    );
                }
                for (i, row) in sc.chunks_exact_mut(kv_len).enumerate() {
                    let qi = r0 + i;
                    // Visible keys of query qi: [lo, qi] in absolute positions.
                    let lo = window.map_or(0, |w| (qi + 1).saturating_sub(w));
                    let (a, z) = (lo - k0, qi + 1 - k0);
                    softmax_span(&mut row[a..z], scale);
                    row[..a].fill(0.0);
                    row[z..].fill(0.0);
                }
                // SAFETY: this task alone writes rows r0..r1 of head h.
                unsafe {
                    mm(
                        rows,
                        d,
                        kv_len,
                        out_ptr.get().add(q_base),
                        q_rs,
                        sc.as_ptr(),
                        kv_len as isize,
                        1,
                        v.as_ptr().add(kv_base),
                        kv_rs,
                        1,
                    );
                }
            }
        },
    );
    out
}

/// In-place `softmax(scale * x)`.
fn softmax_span(x: &mut [f32], scale: f32) {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            m[l] = m[l].max(c[l]);
        }
    }
    let mut max = m.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
    for v in chunks.remainder() {
        max = max.max(*v);
    }
    let shift = max * scale;
    for v in x.iter_mut() {
        *v = *v * scale - shift;
    }
    exp_in_place(x);
    let mut s = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            s[l] += c[l];
        }
    }
    let sum: f32 = s.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>();
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x = exp(x)` element-wise, dispatched to AVX-512 or AVX2+FMA where
/// available.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the features the function is built for.
            unsafe { exp_avx512(x) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports the features the function is built for.
            unsafe { exp_avx2(x) };
            return;
        }
    }
    exp_portable(x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_avx512(x: &mut [f32]) {
    exp_portable(x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(x: &mut [f32]) {
    exp_portable(x);
}

/// Cody–Waite range reduction and a degree-7 polynomial; every step is plain
/// arithmetic so the loop vectorises.
#[inline(always)]
fn exp_portable(x: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adds and subtracts to round
    for v in x.iter_mut() {
        let a = v.clamp(-87.0, 88.0);
        let t = a * LOG2E + ROUND;
        let n = t - ROUND;
        let r = a - n * LN2_HI - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (0.166_666_67
                        + r * (0.041_666_668
                            + r * (0.008_333_334 + r * (0.001_388_889 + r * 0.000_198_412_7))))));
        // `t`'s low mantissa bits hold `n` (as 1.5·2^23 + n): the exponent
        // field 2^n in integer arithmetic, no float-to-int conversion.
        let bits = t.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127) << 23;
        *v = p * f32::from_bits(bits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(q: &[f32], k: &[f32], v: &[f32], s: AttentionShape) -> Vec<f32> {
        let (b, n, h, kv, d) = (s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
        let rep = h / kv;
        let mut out = vec![0f32; q.len()];
        for bi in 0..b {
            for hi in 0..h {
                let g = hi / rep;
                for i in 0..n {
                    let lo = s.window.map_or(0, |w| (i + 1).saturating_sub(w));
                    let qi = &q[((bi * n + i) * h + hi) * d..][..d];
                    let scores: Vec<f64> = (lo..=i)
                        .map(|j| {
                            let kj = &k[((bi * n + j) * kv + g) * d..][..d];
                            qi.iter()
                                .zip(kj)
                                .map(|(a, b)| (*a * *b) as f64)
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (t, j) in (lo..=i).enumerate() {
                        let vj = &v[((bi * n + j) * kv + g) * d..][..d];
                        for c in 0..d {
                            out[((bi * n + i) * h + hi) * d + c] +=
                                (e[t] / z * vj[c] as f64) as f32;
                        }
                    }
                }
            }
        }
        out
    }

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn matches_naive_attention() {
        for (window, seq) in [(None, 150), (Some(40), 150), (None, 7)] {
            let s = AttentionShape {
                batch: 2,
                seq,
                heads: 6,
                kv_heads: 2,
                head_dim: 16,
                window,
            };
            let q = rand(2 * seq * 6 * 16, 1);
            let k = rand(2 * seq * 2 * 16, 2);
            let v = rand(2 * seq * 2 * 16, 3);
            let got = attention(&q, &k, &v, s);
            let want = naive(&q, &k, &v, s);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 2e-5, "window {window:?} seq {seq}: {diff}");
        }
    }

    #[test]
    fn exp_is_accurate() {
        let mut xs: Vec<f32> = (0..20_000).map(|i| -87.0 + i as f32 * 0.0087).collect();
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        exp_in_place(&mut xs);
        for (g, w) in xs.iter().zip(&want) {
            assert!(((g - w) / w).abs() < 3e-7, "{g} vs {w}");
        }
    }
}
