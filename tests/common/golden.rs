//! A golden fixture's `expected.safetensors` (made by tests/fixtures/make_*_fixtures.py): its
//! f32 tensors as f64 and its `input_ids`.

use std::path::Path;

use safetensors::SafeTensors;

pub struct Expected {
    bytes: Vec<u8>,
}

impl Expected {
    /// `dir`/expected.safetensors.
    pub fn load(dir: &Path) -> Expected {
        Expected {
            bytes: std::fs::read(dir.join("expected.safetensors")).expect("the fixture file"),
        }
    }

    pub fn f32s(&self, name: &str) -> Vec<f64> {
        let st = SafeTensors::deserialize(&self.bytes).expect("a safetensors file");
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("fixture tensor {name}"));
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect()
    }

    pub fn ids(&self) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.bytes).expect("a safetensors file");
        let t = st.tensor("input_ids").expect("input_ids");
        t.data()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
            .collect()
    }
}

/// (inputs, targets) for Hugging Face's shifted loss over the fixture's (2, T) ids:
/// ids[:, :T-1] predicting ids[:, 1:] (causality makes their loss and gradients the fixture's).
pub fn shifted(dev: &wgrad::Device, ids: &[u32]) -> wgrad::Result<(wgrad::Tensor, wgrad::Tensor)> {
    let (b, t) = (2, ids.len() / 2);
    let x: Vec<u32> = (0..b)
        .flat_map(|r| ids[r * t..r * t + t - 1].to_vec())
        .collect();
    let y: Vec<u32> = (0..b)
        .flat_map(|r| ids[r * t + 1..(r + 1) * t].to_vec())
        .collect();
    Ok((
        wgrad::Tensor::from_u32(dev, &x, &[b, t - 1])?,
        wgrad::Tensor::from_u32(dev, &y, &[b, t - 1])?,
    ))
}

/// The fixtures' optimizer: 3 steps of AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, decay
/// 0.1 on the decayed parameters, no clipping) on one batch; the loss before each step and
/// after the last.
pub fn three_adamw_steps(
    model: &wgrad::nn::Decoder,
    x: &wgrad::Tensor,
    y: &wgrad::Tensor,
) -> wgrad::Result<Vec<f32>> {
    let config = wgrad::optim::AdamWConfig {
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.1,
        max_grad_norm: None,
    };
    let mut opt = wgrad::optim::AdamW::new(&model.params, config)?;
    let mut losses = Vec::new();
    for _ in 0..3 {
        let loss = model.loss(x, y)?;
        loss.backward()?;
        opt.step(&model.params, 1e-3)?;
        losses.push(loss.item()?);
    }
    losses.push(model.loss(x, y)?.item()?);
    Ok(losses)
}

/// A parameter after those 3 steps against the reference's. Elements whose reference gradient
/// is rounding noise (nonzero and at most `noise` times the tensor's largest gradient: a key
/// bias, whose constant shift of every key softmax ignores) take Adam steps of m / sqrt(v) of
/// either sign in any finite precision: they are held to the bound Adam itself gives (at most
/// lr per step, 3 steps, plus decay); every other element to 1e-3. (Exact zeros, e.g. unused
/// positions, are not noise: Adam leaves them at 0.)
pub fn assert_after_adamw(got: &[f32], want: &[f64], grad: &[f64], noise: f64, what: &str) {
    let scale = grad.iter().fold(0.0f64, |m, g| m.max(g.abs()));
    let is_noise = |i: usize| grad[i] != 0.0 && grad[i].abs() <= noise * scale.max(1e-30);
    let (mut kept_got, mut kept_want) = (Vec::new(), Vec::new());
    for i in 0..got.len() {
        if is_noise(i) {
            let bound = 3.0 * 1e-3 * 1.01 + 3.0 * 1e-3 * 0.1 * want[i].abs();
            assert!(
                (got[i] as f64 - want[i]).abs() <= bound,
                "{what}[{i}] (zero gradient): got {}, want {} (bound {bound})",
                got[i],
                want[i]
            );
        } else {
            kept_got.push(got[i]);
            kept_want.push(want[i]);
        }
    }
    super::assert_close(
        &kept_got,
        &kept_want,
        1e-3,
        &format!("{what} after 3 AdamW steps"),
    );
}
