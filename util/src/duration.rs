//! Seconds as written in a config or a spec, made a [`Duration`] that cannot panic:
//! `Duration::from_secs_f64` panics on a negative, NaN or enormous value, and such values
//! come from people's files.

use std::time::Duration;

/// The longest interval a config may set (a week): poll, rescan, settle and retry times,
/// the pool's timeouts. The daemon's config validator refuses more.
pub const MAX_INTERVAL_SECONDS: f64 = 604_800.0;

/// A configured interval: `seconds` clamped to `0..=MAX_INTERVAL_SECONDS`, so that a value
/// the validator would refuse (or a NaN) can never panic.
pub fn interval(seconds: f64) -> Duration {
    clamped(seconds, 0.0, MAX_INTERVAL_SECONDS)
}

/// `seconds` clamped to `min..=max` (NaN is `min`) as a [`Duration`].
// The one place seconds become a Duration: the clamp makes `from_secs_f64` total.
#[allow(clippy::disallowed_methods)]
pub fn clamped(seconds: f64, min: f64, max: f64) -> Duration {
    let s = if seconds.is_nan() { min } else { seconds };
    Duration::from_secs_f64(s.clamp(min, max))
}

#[cfg(test)]
mod tests {
    use super::clamped;
    use std::time::Duration;

    #[test]
    fn any_number_is_a_duration_within_the_bounds() {
        assert_eq!(clamped(1.5, 0.0, 10.0), Duration::from_millis(1500));
        assert_eq!(clamped(-3.0, 0.0, 10.0), Duration::ZERO);
        assert_eq!(clamped(f64::NAN, 0.001, 10.0), Duration::from_millis(1));
        assert_eq!(clamped(f64::INFINITY, 0.0, 10.0), Duration::from_secs(10));
        assert_eq!(clamped(1e300, 0.0, 86_400.0), Duration::from_secs(86_400));
    }
}
