//! Gradient checks: the gradients backward records on the GPU against central finite
//! differences of a CPU f64 reference of the same function.

use crate::error::{Error, Result};
use crate::graph::{Device, Tensor};

/// One input of a checked function: its values and shape.
#[derive(Clone, Debug)]
pub struct Input {
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
}

/// The worst disagreement found.
#[derive(Clone, Debug)]
pub struct GradCheckReport {
    pub input: usize,
    pub element: usize,
    pub analytic: f64,
    pub numeric: f64,
    /// |analytic - numeric| / max(|numeric|, 1).
    pub error: f64,
}

/// Checks `gpu` (inputs -> a scalar, built from wgrad ops) against `cpu` (the same function
/// in f64): each input's gradient from backward must match the central difference
/// (cpu(x + eps) - cpu(x - eps)) / 2 eps within `tol` (error as in `GradCheckReport`).
/// Returns the worst element; an error names it when it is over `tol` or not finite.
pub fn check(
    device: &Device,
    inputs: &[Input],
    gpu: impl Fn(&[Tensor]) -> Result<Tensor>,
    cpu: impl Fn(&[Vec<f64>]) -> f64,
    eps: f64,
    tol: f64,
) -> Result<GradCheckReport> {
    let params: Vec<Tensor> = inputs
        .iter()
        .map(|i| Ok(Tensor::from_slice(device, &i.data, &i.shape)?.requires_grad()))
        .collect::<Result<_>>()?;
    let loss = gpu(&params)?;
    loss.backward()?;
    let mut worst = GradCheckReport {
        input: 0,
        element: 0,
        analytic: 0.0,
        numeric: 0.0,
        error: 0.0,
    };
    let base: Vec<Vec<f64>> = inputs
        .iter()
        .map(|i| i.data.iter().map(|&v| v as f64).collect())
        .collect();
    for (k, p) in params.iter().enumerate() {
        let analytic = match p.grad() {
            Some(g) => g.to_vec()?,
            None => vec![0.0; p.numel()],
        };
        for (e, &a) in analytic.iter().enumerate() {
            let mut plus = base.clone();
            plus[k][e] += eps;
            let mut minus = base.clone();
            minus[k][e] -= eps;
            let numeric = (cpu(&plus) - cpu(&minus)) / (2.0 * eps);
            let error = (a as f64 - numeric).abs() / numeric.abs().max(1.0);
            if !error.is_finite() || error > worst.error || !a.is_finite() {
                worst = GradCheckReport {
                    input: k,
                    element: e,
                    analytic: a as f64,
                    numeric,
                    error: if a.is_finite() { error } else { f64::INFINITY },
                };
            }
        }
    }
    if worst.error.is_nan() || worst.error > tol {
        return Err(Error::InvalidArgument {
            op: "gradcheck",
            reason: format!(
                "input {} element {}: backward gave {}, finite differences {} (error {:.3e} > {tol:.1e})",
                worst.input, worst.element, worst.analytic, worst.numeric, worst.error
            ),
        });
    }
    Ok(worst)
}
