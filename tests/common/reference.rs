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

/// The gradients [dx, dgamma, dbeta] of sum(layer_norm(x, gamma, beta) * dy): with xhat the
/// normalized row and dxhat = dy gamma, dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat
/// xhat)); dgamma = sum over rows of dy xhat; dbeta = sum over rows of dy.
pub fn layer_norm_backward(x: &Arr, gamma: &Arr, dy: &Arr, eps: f64) -> [Arr; 3] {
    let cols = gamma.numel();
    let n = cols as f64;
    let mut dx = Vec::with_capacity(x.numel());
    let (mut dgamma, mut dbeta) = (vec![0.0; cols], vec![0.0; cols]);
    for (row, dy) in x.data.chunks(cols).zip(dy.data.chunks(cols)) {
        let (mean, rstd) = layer_norm_stats(row, eps);
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let dxhat: Vec<f64> = dy.iter().zip(&gamma.data).map(|(d, g)| d * g).collect();
        let m1 = dxhat.iter().sum::<f64>() / n;
        let m2 = dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        for c in 0..cols {
            dx.push(rstd * (dxhat[c] - m1 - xhat[c] * m2));
            dgamma[c] += dy[c] * xhat[c];
            dbeta[c] += dy[c];
        }
    }
    [
        Arr::new(&x.shape, dx),
        Arr::new(&gamma.shape, dgamma),
        Arr::new(&gamma.shape, dbeta),
    ]
}
