//! The CPU f64 references of the ops, one per op: every test that checks an op against f64
//! computes the expected values here. Reductions, softmax, matmul, gather and where are
//! methods of `Arr` (so they chain with its views); the others are functions of `Arr`s or of
//! scalars. Inputs are the f32 values the GPU sees, widened to f64; nothing is rounded here
//! (a test that wants f16 operands rounds them first).

use super::{broadcast_shapes, Arr};

// ------------------------------------------------------------------------------------------
// Elementwise.

/// The logistic function, 1 / (1 + e^-x).
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
pub fn gelu(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

/// d gelu(x) / dx of the tanh approximation: with t = tanh(sqrt(2 / pi) (x + 0.044715 x^3)),
/// 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
pub fn gelu_grad(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let t = (k * (x + 0.044715 * x * x * x)).tanh();
    let dt = (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
    0.5 * (1.0 + t) + 0.5 * x * dt
}

impl Arr {
    /// `cond != 0 ? x : y`, all broadcast (numpy rules).
    pub fn where_cond(cond: &Arr, x: &Arr, y: &Arr) -> Arr {
        let shape = broadcast_shapes(&broadcast_shapes(&cond.shape, &x.shape), &y.shape);
        let (c, x, y) = (
            cond.broadcast_to(&shape),
            x.broadcast_to(&shape),
            y.broadcast_to(&shape),
        );
        Arr::new(
            &shape,
            (0..c.numel())
                .map(|i| {
                    if c.data[i] != 0.0 {
                        x.data[i]
                    } else {
                        y.data[i]
                    }
                })
                .collect(),
        )
    }
}

// ------------------------------------------------------------------------------------------
// Reductions.

impl Arr {
    /// Sum over `dim`, in index order.
    pub fn sum(&self, dim: usize, keepdim: bool) -> Arr {
        self.reduce(dim, keepdim, 0.0, |a, x| a + x, |a, _| a)
    }

    /// Mean over `dim`: the sum over it divided by its length.
    pub fn mean(&self, dim: usize, keepdim: bool) -> Arr {
        self.reduce(dim, keepdim, 0.0, |a, x| a + x, |a, n| a / n as f64)
    }

    /// Maximum over `dim` (-inf over an empty dim).
    pub fn max(&self, dim: usize, keepdim: bool) -> Arr {
        self.reduce(dim, keepdim, f64::NEG_INFINITY, f64::max, |a, _| a)
    }

    /// Minimum over `dim` (+inf over an empty dim).
    pub fn min(&self, dim: usize, keepdim: bool) -> Arr {
        self.reduce(dim, keepdim, f64::INFINITY, f64::min, |a, _| a)
    }

    /// Sum of every element, in row-major order.
    pub fn sum_all(&self) -> f64 {
        self.data.iter().sum()
    }

    /// Mean of every element.
    pub fn mean_all(&self) -> f64 {
        self.sum_all() / self.numel() as f64
    }

    /// Maximum of every element.
    pub fn max_all(&self) -> f64 {
        self.data.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    /// Minimum of every element.
    pub fn min_all(&self) -> f64 {
        self.data.iter().copied().fold(f64::INFINITY, f64::min)
    }
}

// ------------------------------------------------------------------------------------------
// Softmax.

impl Arr {
    /// Softmax over the last axis, exp(x - m) / sum(exp(x - m)) with m the row's maximum; or
    /// (`log`) log-softmax, x - m - ln(sum(exp(x - m))).
    pub fn softmax(&self, log: bool) -> Arr {
        let cols = *self.shape.last().expect("rank >= 1");
        let mut out = Vec::with_capacity(self.numel());
        if cols > 0 {
            for row in self.data.chunks(cols) {
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|&x| (x - m).exp()).sum();
                for &x in row {
                    out.push(if log {
                        x - m - s.ln()
                    } else {
                        (x - m).exp() / s
                    });
                }
            }
        }
        Arr::new(&self.shape, out)
    }
}

// ------------------------------------------------------------------------------------------
// Matmul and linear.

impl Arr {
    /// (..., M, K) @ (..., K, N) with broadcast batch dims: C[i, j] = sum over k of
    /// A[i, k] B[k, j], summed in k order from 0.
    pub fn matmul(&self, other: &Arr) -> Arr {
        let (ar, br) = (self.rank(), other.rank());
        let (m, k) = (self.shape[ar - 2], self.shape[ar - 1]);
        let (k2, n) = (other.shape[br - 2], other.shape[br - 1]);
        assert_eq!(k, k2, "reference matmul: inner dims");
        let batch = broadcast_shapes(&self.shape[..ar - 2], &other.shape[..br - 2]);
        let mut a_shape = batch.clone();
        a_shape.extend([m, k]);
        let mut b_shape = batch.clone();
        b_shape.extend([k, n]);
        let a = self.broadcast_to(&a_shape);
        let b = other.broadcast_to(&b_shape);
        let nb: usize = batch.iter().product();
        let mut out = vec![0.0; nb * m * n];
        for bi in 0..nb {
            let (ab, bb, cb) = (&a.data[bi * m * k..], &b.data[bi * k * n..], bi * m * n);
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0;
                    for kk in 0..k {
                        acc += ab[i * k + kk] * bb[kk * n + j];
                    }
                    out[cb + i * n + j] = acc;
                }
            }
        }
        let mut shape = batch;
        shape.extend([m, n]);
        Arr::new(&shape, out)
    }
}

/// A linear layer's output, x W + b: x (..., K), W (K, N), b (N) added to every row after the
/// product (no bias: x W).
pub fn linear(x: &Arr, w: &Arr, b: Option<&Arr>) -> Arr {
    let y = x.matmul(w);
    match b {
        Some(b) => y.zip(b, |p, q| p + q),
        None => y,
    }
}

// ------------------------------------------------------------------------------------------
// Gather.

impl Arr {
    /// Entries `idx` of `dim`: out[.., i, ..] = self[.., idx[i], ..]; an index past the end
    /// gives 0 (as the engine documents).
    pub fn index_select(&self, dim: usize, idx: &[u32]) -> Arr {
        let mut shape = self.shape.clone();
        shape[dim] = idx.len();
        Arr::build(&shape, |c| {
            let j = idx[c[dim]] as usize;
            if j >= self.shape[dim] {
                return 0.0;
            }
            let mut src = c.to_vec();
            src[dim] = j;
            self.at(&src)
        })
    }
}

// ------------------------------------------------------------------------------------------
// LayerNorm.

/// The per-row statistics of LayerNorm over rows of `cols`: the mean and 1 / sqrt(var + eps)
/// with the biased variance (divided by `cols`, as the kernel), two passes.
fn layer_norm_stats(row: &[f64], eps: f64) -> (f64, f64) {
    let n = row.len() as f64;
    let mean = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// LayerNorm over the last axis (C = gamma's length): y = (x - mean) / sqrt(var + eps) * gamma
/// + beta, with the biased variance.
pub fn layer_norm(x: &Arr, gamma: &Arr, beta: &Arr, eps: f64) -> Arr {
    let cols = gamma.numel();
    let mut y = Vec::with_capacity(x.numel());
    for row in x.data.chunks(cols) {
        let (mean, rstd) = layer_norm_stats(row, eps);
        for (c, v) in row.iter().enumerate() {
            y.push((v - mean) * rstd * gamma.data[c] + beta.data[c]);
        }
    }
    Arr::new(&x.shape, y)
}

/// The gradients [dx, dgamma, dbeta] of sum(layer_norm(x, gamma, beta) * dy): the statistics
/// of each row of x (`layer_norm_stats`), then the engine's own f64 reference of the backward
/// from them (`wgrad::ops::layer_norm_backward_reference`: with xhat the normalized row and
/// dxhat = dy gamma, dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)); dgamma = sum
/// over rows of dy xhat; dbeta = sum over rows of dy).
pub fn layer_norm_backward(x: &Arr, gamma: &Arr, dy: &Arr, eps: f64) -> [Arr; 3] {
    let cols = gamma.numel();
    let stats: Vec<(f64, f64)> = x
        .data
        .chunks(cols)
        .map(|row| layer_norm_stats(row, eps))
        .collect();
    let [dx, dgamma, dbeta] =
        wgrad::ops::layer_norm_backward_reference(&x.data, &gamma.data, &dy.data, &stats);
    [
        Arr::new(&x.shape, dx),
        Arr::new(&gamma.shape, dgamma),
        Arr::new(&gamma.shape, dbeta),
    ]
}

/// RMSNorm over the last axis (C = weight's length), as Hugging Face's LlamaRMSNorm:
/// y = weight * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps).
pub fn rms_norm(x: &Arr, weight: &Arr, eps: f64) -> Arr {
    let cols = weight.numel();
    let mut y = Vec::with_capacity(x.numel());
    for row in x.data.chunks(cols) {
        let rstd = rms_norm_rstd(row, eps);
        for (c, v) in row.iter().enumerate() {
            y.push(weight.data[c] * v * rstd);
        }
    }
    Arr::new(&x.shape, y)
}

fn rms_norm_rstd(row: &[f64], eps: f64) -> f64 {
    let ms = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
    1.0 / (ms + eps).sqrt()
}

/// The gradients [dx, dweight] of sum(rms_norm(x, weight) * dy): with xhat = x rstd and
/// dxhat = dy weight per row, dx = rstd (dxhat - xhat mean(dxhat xhat)); dweight = sum over
/// rows of dy xhat.
pub fn rms_norm_backward(x: &Arr, weight: &Arr, dy: &Arr, eps: f64) -> [Arr; 2] {
    let cols = weight.numel();
    let n = cols as f64;
    let (mut dx, mut dweight) = (Vec::with_capacity(x.numel()), vec![0.0; cols]);
    for (row, dy) in x.data.chunks(cols).zip(dy.data.chunks(cols)) {
        let rstd = rms_norm_rstd(row, eps);
        let xhat: Vec<f64> = row.iter().map(|v| v * rstd).collect();
        let dxhat: Vec<f64> = (0..cols).map(|c| dy[c] * weight.data[c]).collect();
        let m = (0..cols).map(|c| dxhat[c] * xhat[c]).sum::<f64>() / n;
        for c in 0..cols {
            dx.push(rstd * (dxhat[c] - xhat[c] * m));
            dweight[c] += dy[c] * xhat[c];
        }
    }
    [Arr::new(&x.shape, dx), Arr::new(&weight.shape, dweight)]
}

// ------------------------------------------------------------------------------------------
// SwiGLU.

/// SwiGLU over x = [gate | up] along the last axis (2F): y (..., F) = silu(gate) * up, with
/// silu(g) = g sigmoid(g).
pub fn swiglu(x: &Arr) -> Arr {
    let two_f = *x.shape.last().expect("rank >= 1");
    let f = two_f / 2;
    let mut shape = x.shape.clone();
    *shape.last_mut().expect("rank >= 1") = f;
    let mut y = Vec::with_capacity(x.numel() / 2);
    for row in x.data.chunks(two_f) {
        for j in 0..f {
            let (g, u) = (row[j], row[f + j]);
            y.push(g * sigmoid(g) * u);
        }
    }
    Arr::new(&shape, y)
}

/// The gradient of x (..., 2F) of sum(swiglu(x) * dy): dgate = dy up s (1 + g (1 - s)),
/// dup = dy g s, with s = sigmoid(g).
pub fn swiglu_backward(x: &Arr, dy: &Arr) -> Arr {
    let two_f = *x.shape.last().expect("rank >= 1");
    let f = two_f / 2;
    let mut dx = Vec::with_capacity(x.numel());
    for (row, dy) in x.data.chunks(two_f).zip(dy.data.chunks(f.max(1))) {
        let (mut dg, mut du) = (Vec::with_capacity(f), Vec::with_capacity(f));
        for j in 0..f {
            let (g, u, d) = (row[j], row[f + j], dy[j]);
            let s = sigmoid(g);
            dg.push(d * u * s * (1.0 + g * (1.0 - s)));
            du.push(d * g * s);
        }
        dx.extend(dg);
        dx.extend(du);
    }
    Arr::new(&x.shape, dx)
}

// ------------------------------------------------------------------------------------------
// Cross-entropy.

/// Cross-entropy of logits (..., V) against one target per row, averaged over the rows whose
/// target is not `ignore`: loss = mean over those rows of lse(x) - x[target], with lse the
/// max-subtracted log-sum-exp; and dlogits = (softmax(x) - onehot(target)) / rows counted (0
/// on ignored rows).
pub fn cross_entropy(logits: &Arr, targets: &[u32], ignore: Option<u32>) -> (f64, Arr) {
    let v = *logits.shape.last().expect("rank >= 1");
    let x = &logits.data;
    let n_valid = targets.iter().filter(|&&t| Some(t) != ignore).count() as f64;
    let mut loss = 0.0;
    let mut grad = vec![0.0; x.len()];
    for (r, row) in x.chunks(v).enumerate() {
        let t = targets[r];
        if Some(t) == ignore {
            continue;
        }
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|&a| (a - m).exp()).sum::<f64>().ln();
        loss += lse - row[t as usize];
        for (j, &a) in row.iter().enumerate() {
            let onehot = if j == t as usize { 1.0 } else { 0.0 };
            grad[r * v + j] = ((a - lse).exp() - onehot) / n_valid;
        }
    }
    (loss / n_valid, Arr::new(&logits.shape, grad))
}

// ------------------------------------------------------------------------------------------
// Attention.

/// Causal scaled dot-product attention of (B, H, T, D) q, k, v: O[i] = sum over keys j <= i
/// of softmax_j(q_i . k_j / sqrt(D)) v_j, row by row (max-subtracted).
pub fn causal_attention(q: &Arr, k: &Arr, v: &Arr) -> Arr {
    let [b, h, t, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; b * h * t * d];
    fn row(a: &Arr, bh: usize, i: usize) -> &[f64] {
        let d = a.shape[3];
        &a.data[(bh * a.shape[2] + i) * d..][..d]
    }
    for bh in 0..b * h {
        let row = |a, i| row(a, bh, i);
        for i in 0..t {
            let s: Vec<f64> = (0..=i)
                .map(|j| {
                    scale
                        * row(q, i)
                            .iter()
                            .zip(row(k, j))
                            .map(|(x, y)| x * y)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for (j, pj) in p.iter().enumerate() {
                for (o, x) in out[(bh * t + i) * d..][..d].iter_mut().zip(row(v, j)) {
                    *o += pj / l * x;
                }
            }
        }
    }
    Arr::new(&q.shape, out)
}

// ------------------------------------------------------------------------------------------
// Optimizer.

/// AdamW as PyTorch writes it, in f64: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
/// p = p (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), wd 0 where an
/// element does not decay.
pub struct CpuAdamW {
    pub m: Vec<f64>,
    pub v: Vec<f64>,
    pub t: i32,
}

impl CpuAdamW {
    /// One step over `p` (flattened) with gradient `g`, a decay flag per element, clipping
    /// already applied by the caller.
    pub fn step(
        &mut self,
        p: &mut [f64],
        g: &[f64],
        decay: &[bool],
        lr: f64,
        c: &wgrad::optim::AdamWConfig,
    ) {
        self.t += 1;
        let (b1, b2) = (c.betas.0 as f64, c.betas.1 as f64);
        for i in 0..p.len() {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            let mhat = self.m[i] / (1.0 - b1.powi(self.t));
            let vhat = self.v[i] / (1.0 - b2.powi(self.t));
            let wd = if decay[i] { c.weight_decay as f64 } else { 0.0 };
            p[i] = p[i] * (1.0 - lr * wd) - lr * mhat / (vhat.sqrt() + c.eps as f64);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Grouped-query attention with a rotary embedding.

/// A rotary table as the reference reads it: (positions, D) with a row's D/2 cosines, then its
/// D/2 sines (`wgrad::ops::Rope::table`'s layout).
pub struct RopeTable<'a> {
    pub rows: &'a [f64],
    pub d: usize,
}

impl RopeTable<'_> {
    /// (cos, sin) of element d of position pos.
    fn at(&self, pos: usize, d: usize) -> (f64, f64) {
        let half = self.d / 2;
        let row = &self.rows[pos * self.d..][..self.d];
        (row[d % half], row[half + d % half])
    }

    /// x (one head row of D) rotated at `pos`: x cos + rotate_half(x) sin; `back` the
    /// transpose.
    fn rotate(&self, x: &[f64], pos: usize, back: bool) -> Vec<f64> {
        let half = self.d / 2;
        (0..self.d)
            .map(|d| {
                let (c, s) = self.at(pos, d);
                let partner = x[(d + half) % self.d];
                let sign = if (d < half) != back { -1.0 } else { 1.0 };
                x[d] * c + sign * partner * s
            })
            .collect()
    }
}

/// Causal self-attention of a packed (B, T, (H + 2 Hkv) D) projection in f64: query head h
/// uses key/value head h / (H / Hkv), q and k rotated at positions start.. where `rope` is
/// given. Returns O (B, T, H D) and, for the output gradient `dout` (B, T, H D), the packed
/// input's gradient (dK and dV summed over each kv head's group; dQ, dK rotated back).
pub fn grouped_attention(
    qkv: &Arr,
    heads: usize,
    kv_heads: usize,
    rope: Option<(&RopeTable, usize)>,
    dout: &Arr,
) -> (Arr, Arr) {
    let [b, t, w] = [qkv.shape[0], qkv.shape[1], qkv.shape[2]];
    let d = w / (heads + 2 * kv_heads);
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    // Row (b, t) of head `col` (in heads of D along the packed dim), rotated where `rot`.
    let row = |bi: usize, ti: usize, col: usize| -> &[f64] {
        &qkv.data[(bi * t + ti) * w + col * d..][..d]
    };
    let roped = |x: &[f64], ti: usize| -> Vec<f64> {
        match rope {
            Some((r, start)) => r.rotate(x, start + ti, false),
            None => x.to_vec(),
        }
    };
    let mut out = vec![0.0; b * t * heads * d];
    let mut grad = vec![0.0; b * t * w];
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    for bi in 0..b {
        for h in 0..heads {
            let (kc, vc) = (heads + h / group, heads + kv_heads + h / group);
            let q: Vec<Vec<f64>> = (0..t).map(|i| roped(row(bi, i, h), i)).collect();
            let k: Vec<Vec<f64>> = (0..t).map(|j| roped(row(bi, j, kc), j)).collect();
            let v: Vec<&[f64]> = (0..t).map(|j| row(bi, j, vc)).collect();
            let mut dq_rot = vec![vec![0.0; d]; t];
            let mut dk_rot = vec![vec![0.0; d]; t];
            for i in 0..t {
                let s: Vec<f64> = (0..=i).map(|j| scale * dot(&q[i], &k[j])).collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|x| x / l).collect();
                let o = &mut out[(bi * t + i) * heads * d + h * d..][..d];
                for (j, pj) in p.iter().enumerate() {
                    for (oe, x) in o.iter_mut().zip(v[j]) {
                        *oe += pj * x;
                    }
                }
                let g = &dout.data[(bi * t + i) * heads * d + h * d..][..d];
                let dp: Vec<f64> = (0..=i).map(|j| dot(g, v[j])).collect();
                let dsum: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    let ds = p[j] * (dp[j] - dsum) * scale;
                    for e in 0..d {
                        dq_rot[i][e] += ds * k[j][e];
                        dk_rot[j][e] += ds * q[i][e];
                        grad[(bi * t + j) * w + vc * d + e] += p[j] * g[e];
                    }
                }
            }
            for ti in 0..t {
                let back = |x: &[f64]| match rope {
                    Some((r, start)) => r.rotate(x, start + ti, true),
                    None => x.to_vec(),
                };
                let (dq, dk) = (back(&dq_rot[ti]), back(&dk_rot[ti]));
                for e in 0..d {
                    grad[(bi * t + ti) * w + h * d + e] += dq[e];
                    grad[(bi * t + ti) * w + kc * d + e] += dk[e];
                }
            }
        }
    }
    (
        Arr::new(&[b, t, heads * d], out),
        Arr::new(&qkv.shape, grad),
    )
}
