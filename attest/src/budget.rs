//! The arithmetic behind the caps (README, "Why these numbers"), shared by
//! `rackwarden budget` and the verifier's policy so both use one implementation.

use serde::{Deserialize, Serialize};

/// Bytes per parameter of common dtypes.
pub fn dtype_bytes(dtype: &str) -> Option<f64> {
    Some(match dtype {
        "fp32" | "f32" => 4.0,
        "bf16" | "fp16" | "f16" => 2.0,
        "fp8" | "int8" => 1.0,
        "fp4" | "int4" => 0.5,
        _ => return None,
    })
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BudgetInput {
    pub params: f64,
    /// Bytes per parameter of a full gradient or update as sent (fp8: 1).
    pub bytes_per_param: f64,
    /// Compression of a low-communication sync relative to an fp32 gradient (146 for
    /// Covenant-72B's SparseLoCo), i.e. sync bytes = params x 4 / compression.
    pub compression_vs_fp32: f64,
    pub inner_steps: f64,
    pub step_time_s: f64,
    pub cap_bytes_per_s: f64,
    pub wipe_interval_s: f64,
    /// Trainable state per parameter beyond the weights (Adam in fp32: 8).
    pub optimizer_bytes_per_param: f64,
    /// Weights in the trainable state, bytes per parameter.
    pub weight_bytes_per_param: f64,
    pub bytes_per_token: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BudgetOutput {
    pub full_gradient_bytes: f64,
    pub full_gradient_send_s: f64,
    pub compressed_sync_bytes: f64,
    pub compressed_sync_send_s: f64,
    pub compute_per_sync_s: f64,
    /// (compute + send) / compute: how much slower training is than with free syncing.
    pub slowdown_factor: f64,
    pub bytes_per_wipe_epoch: f64,
    pub trainable_state_bytes: f64,
    /// bytes_per_wipe_epoch / trainable_state_bytes: the most local state can change per epoch.
    pub epoch_fraction_of_state: f64,
    pub tokens_per_s: f64,
}

/// An input the arithmetic cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    #[error("`{name}` must be a positive number (it is {value})")]
    NotPositive { name: &'static str, value: f64 },
    #[error("state bytes per parameter must not be negative")]
    NegativeState,
}

impl BudgetInput {
    pub fn validate(&self) -> Result<(), BudgetError> {
        for (name, v) in [
            ("params", self.params),
            ("bytes_per_param", self.bytes_per_param),
            ("compression_vs_fp32", self.compression_vs_fp32),
            ("inner_steps", self.inner_steps),
            ("step_time_s", self.step_time_s),
            ("cap_bytes_per_s", self.cap_bytes_per_s),
            ("wipe_interval_s", self.wipe_interval_s),
            ("bytes_per_token", self.bytes_per_token),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(BudgetError::NotPositive { name, value: v });
            }
        }
        if !(self.optimizer_bytes_per_param >= 0.0 && self.weight_bytes_per_param >= 0.0) {
            return Err(BudgetError::NegativeState);
        }
        Ok(())
    }

    pub fn compute(&self) -> BudgetOutput {
        let full = self.params * self.bytes_per_param;
        let sync = self.params * 4.0 / self.compression_vs_fp32;
        let compute = self.inner_steps * self.step_time_s;
        let sync_s = sync / self.cap_bytes_per_s;
        let epoch = self.cap_bytes_per_s * self.wipe_interval_s;
        let state = self.params * (self.weight_bytes_per_param + self.optimizer_bytes_per_param);
        BudgetOutput {
            full_gradient_bytes: full,
            full_gradient_send_s: full / self.cap_bytes_per_s,
            compressed_sync_bytes: sync,
            compressed_sync_send_s: sync_s,
            compute_per_sync_s: compute,
            slowdown_factor: (compute + sync_s) / compute,
            bytes_per_wipe_epoch: epoch,
            trainable_state_bytes: state,
            epoch_fraction_of_state: epoch / state,
            tokens_per_s: self.cap_bytes_per_s / self.bytes_per_token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn design_case() -> BudgetInput {
        BudgetInput {
            params: 1e12,
            bytes_per_param: 1.0,
            compression_vs_fp32: 146.0,
            inner_steps: 30.0,
            step_time_s: 10.0,
            cap_bytes_per_s: 10e6,
            wipe_interval_s: 900.0,
            optimizer_bytes_per_param: 8.0,
            weight_bytes_per_param: 2.0,
            bytes_per_token: 4.0,
        }
    }

    #[test]
    fn a_trillion_fp8_gradient_takes_about_a_day_at_10_mb_s() {
        let o = design_case().compute();
        assert_eq!(o.full_gradient_bytes, 1e12);
        assert!(
            (o.full_gradient_send_s - 1e5).abs() < 1.0,
            "{}",
            o.full_gradient_send_s
        );
    }

    #[test]
    fn sparseloco_sync_is_27_gb_46_min_and_a_10x_slowdown() {
        let o = design_case().compute();
        assert!(
            (o.compressed_sync_bytes / 1e9 - 27.4).abs() < 0.1,
            "{}",
            o.compressed_sync_bytes
        );
        assert!(
            (o.compressed_sync_send_s / 60.0 - 45.7).abs() < 0.2,
            "{}",
            o.compressed_sync_send_s / 60.0
        );
        assert_eq!(o.compute_per_sync_s, 300.0);
        assert!(
            (o.slowdown_factor - 10.1).abs() < 0.1,
            "{}",
            o.slowdown_factor
        );
        // 15-minute wipes bound the state change to 9 GB of a 10 TB trainable state.
        assert!((o.bytes_per_wipe_epoch - 9e9).abs() < 1.0);
        assert!((o.epoch_fraction_of_state - 9e-4).abs() < 1e-9);
        assert_eq!(o.tokens_per_s, 2.5e6);
    }

    #[test]
    fn garbage_is_refused() {
        let mut i = design_case();
        i.cap_bytes_per_s = 0.0;
        assert!(
            i.validate()
                .unwrap_err()
                .to_string()
                .contains("cap_bytes_per_s")
        );
        i.cap_bytes_per_s = f64::NAN;
        assert!(i.validate().is_err());
    }
}
