//! Mixed precision by scope: matmuls recorded inside `autocast(true, ..)` round their operands
//! to f16 and accumulate in f32 (on tensor cores where the adapter has cooperative matrices),
//! whatever their storage type; every other op keeps f32. Backward rules remember the
//! precision of their forward, so the backward matmuls of an autocast forward run in f16 too.

use std::cell::Cell;

thread_local! {
    static AUTOCAST: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with matmuls in f16 (`on`) or in the precision of their operands (`!on`).
pub fn autocast<T>(on: bool, f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(on)));
    f()
}

/// Whether matmuls recorded now run in f16.
pub fn autocast_enabled() -> bool {
    AUTOCAST.with(|a| a.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert!(!autocast_enabled());
        autocast(true, || {
            assert!(autocast_enabled());
            autocast(false, || assert!(!autocast_enabled()));
            assert!(autocast_enabled());
        });
        assert!(!autocast_enabled());
    }
}
