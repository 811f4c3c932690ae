//! The A/B driver every comparison of `load` runs on: `--compare-metrics` (on, off),
//! `--compare-journal` (on, off), `--workload-set peers` (engine, direct) and `--workload-set
//! serve` (in-process, HTTP).
//!
//! [`alternate`] runs side A, then side B, `--rounds` times (at least once) and keeps each side's
//! best round by a score, higher winning and the earlier round winning a tie: on a shared, noisy
//! machine interference only ever slows a round down. The violations of every phase of every
//! round, of both sides, are counted, in the order the phases ran. A side is anything that
//! knows its phases ([`Side`]): one [`Phase`], or a phase and a companion phase run with it.
//! [`ratio`] and [`cost`] are the figures the comparisons print.

use super::driver::Phase;
use super::stats::Recorder;

/// What one side of a round measured.
pub trait Side {
    /// Its phases, in the order they ran (their violations are counted).
    fn phases(&self) -> Vec<&Phase>;
}

impl Side for Phase {
    fn phases(&self) -> Vec<&Phase> {
        vec![self]
    }
}

impl Side for (Phase, Phase) {
    fn phases(&self) -> Vec<&Phase> {
        vec![&self.0, &self.1]
    }
}

/// What the alternating rounds gave.
#[derive(Debug)]
pub struct Alternated<T> {
    /// Side A's best round.
    pub a: T,
    /// Side B's best round.
    pub b: T,
    /// Rounds per side.
    pub rounds: u32,
    /// Violations of every phase of both sides, every round.
    pub violations: Recorder,
}

/// Runs `a` then `b`, `rounds` times (at least once), keeping each side's best round by `score`;
/// the first error ends the run.
pub async fn alternate<T: Side>(
    rounds: u32,
    mut a: impl AsyncFnMut() -> Result<T, String>,
    mut b: impl AsyncFnMut() -> Result<T, String>,
    score: impl Fn(&T) -> f64,
) -> Result<Alternated<T>, String> {
    let rounds = rounds.max(1);
    let (mut best_a, mut best_b) = (None, None);
    let mut violations = Recorder::default();
    for _ in 0..rounds {
        let round_a = a().await?;
        let round_b = b().await?;
        for phase in round_a.phases().into_iter().chain(round_b.phases()) {
            violations.merge_violations(&phase.stats);
        }
        keep_best(&mut best_a, round_a, &score);
        keep_best(&mut best_b, round_b, &score);
    }
    match (best_a, best_b) {
        (Some(a), Some(b)) => Ok(Alternated {
            a,
            b,
            rounds,
            violations,
        }),
        _ => Err("no round ran".into()),
    }
}

/// Keeps in `best` whichever of it and `new` scores higher (the one already there on a tie).
pub fn keep_best<T>(best: &mut Option<T>, new: T, score: impl Fn(&T) -> f64) {
    if best.as_ref().is_none_or(|b| score(&new) > score(b)) {
        *best = Some(new);
    }
}

/// `a ÷ b`, 0 when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 && a.is_finite() { a / b } else { 0.0 }
}

/// What side `on` costs against `off`: 1 − on ÷ off calls/s (0 when `off` measured nothing).
pub fn cost(on: &Phase, off: &Phase) -> f64 {
    1.0 - ratio(on.calls_per_s(), off.calls_per_s())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_higher_score_is_kept_and_a_tie_keeps_the_earlier() {
        let mut best = None;
        for (i, score) in [(0, 2.0), (1, 3.0), (2, 3.0), (3, 1.0)] {
            keep_best(&mut best, (i, score), |r: &(i32, f64)| r.1);
        }
        assert_eq!(best, Some((1, 3.0)));
    }

    /// A side that runs no phase: its round number and score.
    #[derive(Debug, PartialEq)]
    struct Round(u32, f64);

    impl Side for Round {
        fn phases(&self) -> Vec<&Phase> {
            Vec::new()
        }
    }

    #[tokio::test]
    async fn sides_alternate_a_first_and_each_keeps_its_best_round() {
        let order = std::cell::RefCell::new(Vec::new());
        let (mut na, mut nb) = (0, 0);
        let got = alternate(
            3,
            async || {
                na += 1;
                order.borrow_mut().push('a');
                Ok(Round(na, [1.0, 5.0, 5.0][na as usize - 1]))
            },
            async || {
                nb += 1;
                order.borrow_mut().push('b');
                Ok(Round(nb, [2.0, 1.0, 4.0][nb as usize - 1]))
            },
            |r: &Round| r.1,
        )
        .await
        .unwrap();
        assert_eq!(order.into_inner(), ['a', 'b', 'a', 'b', 'a', 'b']);
        assert_eq!(
            (got.a, got.b, got.rounds),
            (Round(2, 5.0), Round(3, 4.0), 3)
        );
    }
}
