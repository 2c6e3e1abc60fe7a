//! Learning-rate schedules: linear warm-up, then constant or cosine decay.

/// The learning rate at each step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrSchedule {
    /// Linear warm-up over `warmup` steps, then `lr`.
    Constant { warmup: usize },
    /// Linear warm-up, then cosine decay to `min_ratio * lr` at step `total`.
    Cosine {
        warmup: usize,
        total: usize,
        min_ratio: f32,
    },
}

impl LrSchedule {
    /// The rate at step `step` (0-based) for base rate `lr`.
    pub fn lr_at(&self, step: usize, lr: f32) -> f32 {
        let warmup = match *self {
            LrSchedule::Constant { warmup } | LrSchedule::Cosine { warmup, .. } => warmup,
        };
        if step < warmup {
            return lr * (step + 1) as f32 / warmup as f32;
        }
        match *self {
            LrSchedule::Constant { .. } => lr,
            LrSchedule::Cosine {
                total, min_ratio, ..
            } => {
                let span = total.saturating_sub(warmup).max(1);
                let t = ((step - warmup) as f32 / span as f32).min(1.0);
                let cos = 0.5 * (1.0 + (std::f32::consts::PI * t).cos());
                lr * (min_ratio + (1.0 - min_ratio) * cos)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LrSchedule;

    #[test]
    fn warmup_then_cosine_reaches_the_floor() {
        let s = LrSchedule::Cosine {
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert!((s.lr_at(0, 1.0) - 0.1).abs() < 1e-6);
        assert!((s.lr_at(9, 1.0) - 1.0).abs() < 1e-6);
        assert!((s.lr_at(10, 1.0) - 1.0).abs() < 1e-6);
        assert!((s.lr_at(60, 1.0) - 0.55).abs() < 1e-5);
        assert!((s.lr_at(110, 1.0) - 0.1).abs() < 1e-6);
        assert!((s.lr_at(500, 1.0) - 0.1).abs() < 1e-6);
        assert_eq!(LrSchedule::Constant { warmup: 0 }.lr_at(7, 0.3), 0.3);
    }
}
