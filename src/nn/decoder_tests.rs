//! Tests of the decoder's parts that lavapipe's adapter does not reach through a whole model.

use crate::error::Result;
use crate::graph::{DType, Device, Tensor};
use crate::nn::{Decoder, Family, ModelConfig};

/// Under autocast on an adapter with cooperative matrices the fused qkv projection is
/// stored f16 (`qkv_dtype`), and Qwen3's q_norm/k_norm take it so. Lavapipe has no
/// cooperative matrices, so the projection is made f16 here by hand: the result stays f16
/// (the norms store the projection's type, v is copied as it is), within f16 rounding of the
/// f32 path, and the gradients flow back through it.
#[test]
fn qk_norm_takes_an_f16_projection() -> Result<()> {
    let dev = Device::new()?;
    assert!(
        dev.gpu().has(wgpu::Features::SHADER_F16),
        "the adapter has no shader-f16 (lavapipe has it)"
    );
    let config = ModelConfig {
        family: Family::Qwen3,
        n_kv_head: 2,
        head_dim: 8,
        n_inner: 64,
        rope_theta: 10000.0,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        ..ModelConfig::gpt2(50, 16, 32, 1, 4)
    };
    let mut model = Decoder::new(&dev, config.clone(), 1)?;
    model.set_amp(true)?;
    let (b, t) = (2, 5);
    let qkv = Tensor::rand_normal(&dev, &[b, t, config.qkv_width()], 0.0, 1.0, 3)?
        .to_dtype(DType::F16)?
        .to_dtype(DType::F32)?;
    let want = model.qk_norm(0, &qkv)?.to_vec()?;
    let half = qkv.to_dtype(DType::F16)?.requires_grad();
    let got = crate::ops::autocast(true, || model.qk_norm(0, &half))?;
    assert_eq!(got.dtype(), DType::F16, "the projection's type kept");
    let got = got.to_dtype(DType::F32)?;
    for (i, (g, w)) in got.to_vec()?.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 2e-3 * w.abs().max(1.0),
            "[{i}]: {g} vs {w}"
        );
    }
    got.mul(&got)?.sum_all()?.backward()?;
    for name in ["q_norm", "k_norm"] {
        let grad = model
            .params
            .read_grad(&format!("layers.0.self_attn.{name}.weight"))?;
        assert!(grad.is_some_and(|g| g.iter().all(|v| v.is_finite() && *v != 0.0)));
    }
    let dqkv = half.grad().expect("the projection's gradient").to_vec()?;
    assert!(dqkv.iter().all(|v| v.is_finite()) && dqkv.iter().any(|&v| v != 0.0));
    Ok(())
}
