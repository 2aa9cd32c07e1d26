//! The one way calibration runs independent evaluations at once: a measurement's
//! prediction, an interval's exact points, a chip under other parameter values. Each is a
//! whole estimate or candidate evaluation (milliseconds), so plain scoped threads over
//! contiguous chunks are enough, and the results come back in order whatever the
//! machine's core count — the answers do not depend on it.

/// `f` of each of `items` on up to four threads, in order. A thread that panicked gives
/// its items `R::default()`.
pub fn map<T: Sync, R: Send + Default>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    map_beside(items, f, || ()).0
}

/// [`map`], with `beside` run on the calling thread meanwhile (which would otherwise wait):
/// work the results do not depend on, such as the point estimate an interval's exact
/// points linearise around. On a machine of two cores, an interval's three exact points
/// take two rounds of one thread and one of the other; the caller's own work fills that.
pub fn map_beside<T: Sync, R: Send + Default, S>(
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
    beside: impl FnOnce() -> S,
) -> (Vec<R>, S) {
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
        let other = beside();
        let results = handles
            .into_iter()
            .flat_map(|(n, h)| {
                h.join()
                    .unwrap_or_else(|_| (0..n).map(|_| R::default()).collect())
            })
            .collect();
        (results, other)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_work_runs_on_its_own_thread_beside_the_others_in_order() {
        let items: Vec<u64> = (0..7).collect();
        let caller = std::thread::current().id();
        let (squares, beside) = map_beside(
            &items,
            |x| (x * x, std::thread::current().id() != caller),
            || (std::thread::current().id() == caller, 42),
        );
        assert_eq!(
            squares.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![0, 1, 4, 9, 16, 25, 36]
        );
        assert!(squares.iter().all(|(_, elsewhere)| *elsewhere));
        assert_eq!(beside, (true, 42));
        assert_eq!(map(&items, |x| x + 1), (1..8).collect::<Vec<u64>>());
        let (none, alone) = map_beside(&[] as &[u64], |x| *x, || "alone");
        assert!(none.is_empty());
        assert_eq!(alone, "alone");
    }
}
