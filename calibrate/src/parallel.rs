//! The one way calibration runs independent evaluations at once: a measurement's
//! prediction, an interval's exact points, a chip under other parameter values. Each is a
//! whole estimate or candidate evaluation (milliseconds), so plain scoped threads over
//! contiguous chunks are enough, and the results come back in order whatever the
//! machine's core count — the answers do not depend on it.

/// `f` of each of `items` on up to four threads, in order. A thread that panicked gives
/// its items `R::default()`.
pub fn map<T: Sync, R: Send + Default>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let chunk = items.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| {
                (
                    part.len(),
                    s.spawn(move || part.iter().map(f).collect::<Vec<R>>()),
                )
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|(n, h)| {
                h.join()
                    .unwrap_or_else(|_| (0..n).map(|_| R::default()).collect())
            })
            .collect()
    })
}
