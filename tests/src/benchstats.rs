//! The arithmetic every benchmark of ours shares: medians, and armed runs judged against the
//! anchor runs on both sides of them, with a confidence interval that assumes no distribution.
//! These machines are noisy, so a ratio is only reported with what it could have been.

/// `kernel.bpf_stats_enabled` turned on for as long as this lives, then set back to what it
/// was: the kernel then counts every program's runs and their time (two clock reads a run).
pub struct BpfStatsOn {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatsOn {
    /// `None` where the setting cannot be written (not root, or no such sysctl).
    pub fn enable() -> Option<BpfStatsOn> {
        let before = std::fs::read_to_string(BPF_STATS).ok()?;
        std::fs::write(BPF_STATS, "1").ok()?;
        Some(BpfStatsOn { before })
    }
}

impl Drop for BpfStatsOn {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.before.trim());
    }
}

/// The median of `v` (sorts it; the upper middle for an even count).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The ranks (0-based, inclusive) of `n` sorted values that bound their median's 95%
/// confidence interval without assuming a distribution: the normal approximation of
/// Binomial(n, 1/2).
pub fn median_ci95(n: usize) -> (usize, usize) {
    let half = 0.98 * (n as f64).sqrt();
    let lo = ((n as f64 / 2.0 - half).floor().max(0.0)) as usize;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).min(n.saturating_sub(1));
    (lo, hi)
}

/// Runs taken in turn, anchor first and last (anchor, armed, anchor, ..., anchor): each armed
/// value against the mean of the anchors on both sides of it, so a drift of the machine that
/// is linear over three runs cancels.
#[derive(Debug, Clone)]
pub struct Bracketed {
    /// armed / mean(anchor before, anchor after), sorted.
    pub ratios: Vec<f64>,
}

impl Bracketed {
    /// `values[i]` is run i's measurement; `armed(i)` and `anchor(i)` say what run i was (a
    /// run may be neither: another arm). Armed runs without an anchor on both sides are left
    /// out.
    pub fn new(
        values: &[f64],
        armed: impl Fn(usize) -> bool,
        anchor: impl Fn(usize) -> bool,
    ) -> Bracketed {
        let mut ratios: Vec<f64> = (1..values.len().saturating_sub(1))
            .filter(|&i| armed(i) && anchor(i - 1) && anchor(i + 1))
            .map(|i| values[i] / ((values[i - 1] + values[i + 1]) / 2.0))
            .collect();
        ratios.sort_by(|a, b| a.total_cmp(b));
        Bracketed { ratios }
    }

    pub fn median(&self) -> f64 {
        self.ratios[self.ratios.len() / 2]
    }

    /// The median's 95% confidence interval.
    pub fn ci95(&self) -> (f64, f64) {
        let (lo, hi) = median_ci95(self.ratios.len());
        (self.ratios[lo], self.ratios[hi])
    }

    /// `median x (95% CI lo to hi; middle half lo to hi), n ratios`.
    pub fn describe(&self) -> String {
        let n = self.ratios.len();
        let (lo, hi) = self.ci95();
        format!(
            "{:.3}x (95% CI {lo:.3}x to {hi:.3}x; middle half {:.3}x to {:.3}x; {n} ratios)",
            self.median(),
            self.ratios[n / 4],
            self.ratios[3 * n / 4],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracketed_ratios_cancel_a_linear_drift() {
        // The machine slows by 1% a run; the armed runs cost 5% on top.
        let values: Vec<f64> = (0..21)
            .map(|i| {
                let base = 100.0 * (1.0 + 0.01 * i as f64);
                if i % 2 == 1 { base * 1.05 } else { base }
            })
            .collect();
        let b = Bracketed::new(&values, |i| i % 2 == 1, |i| i % 2 == 0);
        assert_eq!(b.ratios.len(), 10);
        assert!((b.median() - 1.05).abs() < 1e-9, "{}", b.describe());
    }

    #[test]
    fn an_armed_run_beside_another_arm_is_left_out() {
        let values = [100.0, 90.0, 100.0, 50.0, 100.0, 80.0, 50.0, 100.0];
        let kind = ['a', 'x', 'a', 'y', 'a', 'x', 'y', 'a'];
        let b = Bracketed::new(&values, |i| kind[i] == 'x', |i| kind[i] == 'a');
        assert_eq!(b.ratios, vec![0.9]);
    }

    #[test]
    fn the_interval_holds_the_median_and_widens_with_fewer_values() {
        let (lo, hi) = median_ci95(250);
        assert!(lo < 125 && hi > 125 && hi < 250);
        let (lo_small, hi_small) = median_ci95(10);
        assert!(hi_small - lo_small < 10 && (hi_small - lo_small) * 25 > (hi - lo));
        assert_eq!(median_ci95(1), (0, 0));
    }
}
