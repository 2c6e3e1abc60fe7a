//! The command's log: `tracing` events at or above a level, one line each on stderr
//! (`warning: not caching the token ids: ...`), as the command's own `error: ...` line is
//! written. Warnings by default; each `-v` adds a level (info, debug, trace). Spans are never
//! enabled here, so the training step's spans stay on tracing's disabled path (`profile`
//! installs its own collector for them while it runs).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The level `-v` repeated `verbose` times shows.
pub fn level(verbose: u8) -> Level {
    match verbose {
        0 => Level::WARN,
        1 => Level::INFO,
        2 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// Writes events at `level` and above to stderr for the rest of the process.
pub fn init(level: Level) {
    // Only fails when a subscriber is already set (a second call): the first one stays.
    let _ = tracing::subscriber::set_global_default(StderrLog {
        level,
        next_id: AtomicU64::new(1),
    });
}

struct StderrLog {
    level: Level,
    next_id: AtomicU64,
}

/// An event as one line: its message, then its other fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

/// The line `event` prints as.
fn format(level: &Level, message: &str, fields: &str) -> String {
    let label = match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    };
    format!("{label}: {message}{fields}")
}

impl Subscriber for StderrLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && *metadata.level() <= self.level
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.level))
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Spans are never enabled; an id all the same, as the trait requires one.
        Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        eprintln!(
            "{}",
            format(event.metadata().level(), &line.message, &line.fields)
        );
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_by_default_and_each_v_adds_a_level() {
        assert_eq!(level(0), Level::WARN);
        assert_eq!(level(1), Level::INFO);
        assert_eq!(level(9), Level::TRACE);
        let log = StderrLog {
            level: level(0),
            next_id: AtomicU64::new(1),
        };
        assert_eq!(log.max_level_hint(), Some(LevelFilter::WARN));
        assert_eq!(format(&Level::WARN, "m", " a=1"), "warning: m a=1");
    }
}
