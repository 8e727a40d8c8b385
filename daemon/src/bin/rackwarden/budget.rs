//! `rackwarden budget`: the arithmetic behind the caps (shared with the verifier's policy).

use rackwarden::units;
use rackwarden_attest::budget::{BudgetInput, dtype_bytes};

use crate::args::BudgetArgs;

pub fn budget_cmd(a: &BudgetArgs) -> anyhow::Result<()> {
    let input = BudgetInput {
        params: a.params,
        bytes_per_param: dtype_bytes(&a.dtype).ok_or_else(|| {
            anyhow::anyhow!(
                "--dtype: unknown dtype `{}` (fp32, bf16, fp16, fp8, int8, fp4, int4)",
                a.dtype
            )
        })?,
        compression_vs_fp32: a.compression,
        inner_steps: a.inner_steps,
        step_time_s: a.step_time.0.as_secs_f64(),
        cap_bytes_per_s: a
            .cap
            .bytes_per_sec(Some(a.bytes_per_token as u64))
            .map_err(|e| anyhow::anyhow!("--cap: {e}"))? as f64,
        wipe_interval_s: a.wipe_interval.0.as_secs_f64(),
        optimizer_bytes_per_param: a.optimizer_bytes_per_param,
        weight_bytes_per_param: a.weight_bytes_per_param,
        bytes_per_token: a.bytes_per_token,
    };
    input.validate().map_err(anyhow::Error::msg)?;
    let o = input.compute();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"input": input, "output": o}))?
        );
    } else {
        let t = |s: f64| {
            if s >= 86400.0 {
                format!("{:.2} days", s / 86400.0)
            } else if s >= 3600.0 {
                format!("{:.2} h", s / 3600.0)
            } else if s >= 60.0 {
                format!("{:.1} min", s / 60.0)
            } else {
                format!("{s:.1} s")
            }
        };
        println!(
            "cap {}  wipe every {}",
            units::fmt_rate(input.cap_bytes_per_s),
            t(input.wipe_interval_s)
        );
        println!("{:<48} {:>16} {:>14}", "", "bytes", "time at cap");
        println!(
            "{:<48} {:>16} {:>14}",
            format!("full gradient ({} B/param)", input.bytes_per_param),
            units::fmt_bytes(o.full_gradient_bytes),
            t(o.full_gradient_send_s)
        );
        println!(
            "{:<48} {:>16} {:>14}",
            format!("compressed sync ({}x vs fp32)", input.compression_vs_fp32),
            units::fmt_bytes(o.compressed_sync_bytes),
            t(o.compressed_sync_send_s)
        );
        println!(
            "{:<48} {:>16} {:>14}",
            format!(
                "compute per sync ({} steps x {})",
                input.inner_steps,
                t(input.step_time_s)
            ),
            "",
            t(o.compute_per_sync_s)
        );
        println!("slowdown vs free syncing: {:.1}x", o.slowdown_factor);
        println!(
            "bytes that can cross per wipe epoch: {} = {:.4}% of the trainable state ({})",
            units::fmt_bytes(o.bytes_per_wipe_epoch),
            100.0 * o.epoch_fraction_of_state,
            units::fmt_bytes(o.trainable_state_bytes)
        );
        println!(
            "tokens/s the cap allows at {} B/token: {:.0}",
            input.bytes_per_token, o.tokens_per_s
        );
    }
    Ok(())
}
