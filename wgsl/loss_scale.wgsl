// Dynamic loss scaling, after the AdamW dispatches of a mixed-precision step (one lane):
// state = [scale, clean steps since the last change, applied steps, skipped steps] (f32 counts,
// exact to 2^24). A non-finite squared gradient norm (overflow, found by the norm's reduction)
// means the step was skipped: the scale is multiplied by `backoff` (not below 1) and the clean
// count restarts. Otherwise the step counts as applied, and after `growth_interval` clean steps
// the scale is multiplied by `growth` (up to `max_scale`). No host round-trip.

struct Params {
    growth_interval: u32,
    growth: f32,
    backoff: f32,
    max_scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> state: array<f32>;
@group(0) @binding(2) var<storage, read> norm_sq: array<f32>;

@compute @workgroup_size(1)
fn loss_scale_update() {
    if (!(norm_sq[0] <= 3.4028235e38)) {
        state[0] = max(state[0] * p.backoff, 1.0);
        state[1] = 0.0;
        state[3] = state[3] + 1.0;
        return;
    }
    state[2] = state[2] + 1.0;
    state[1] = state[1] + 1.0;
    if (state[1] >= f32(p.growth_interval)) {
        state[0] = min(state[0] * p.growth, p.max_scale);
        state[1] = 0.0;
    }
}
