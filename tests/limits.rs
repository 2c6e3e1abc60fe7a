//! Tensors past the adapter's storage-binding limit fail with an error that names the limit,
//! before anything is allocated.

use wgrad::{Device, Error, Tensor};

#[test]
fn a_tensor_over_the_binding_limit_is_a_clear_error() {
    let dev = Device::new()
        .expect("a GPU adapter (on Linux without one: apt-get install mesa-vulkan-drivers)");
    let limit = dev.gpu().limits.max_storage_buffer_binding_size;
    let numel = (limit / 4 + 1) as usize;
    let before = dev.pool_stats().buffers_created;
    match Tensor::zeros(&dev, &[numel]) {
        Err(e @ Error::BindingTooLarge { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&limit.to_string()),
                "the message names the limit: {msg}"
            );
            assert!(msg.contains("max_storage_buffer_binding_size"), "{msg}");
            assert!(
                msg.contains(&format!("[{numel}]")),
                "the message names the shape: {msg}"
            );
        }
        other => panic!("expected BindingTooLarge, got {other:?}"),
    }
    assert_eq!(
        dev.pool_stats().buffers_created,
        before,
        "nothing was allocated"
    );
    // At the limit itself the tensor works.
    let ok = Tensor::full(&dev, &[(limit / 4) as usize / 64], 2.0)
        .and_then(|t| t.sum_all())
        .and_then(|s| s.item());
    assert_eq!(
        ok.expect("a tensor under the limit"),
        2.0 * ((limit / 4) as usize / 64) as f32
    );
}
