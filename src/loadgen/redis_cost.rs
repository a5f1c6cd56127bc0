//! What a load run cost the Redis behind the server: the Redis process's CPU time (`INFO cpu`, user +
//! system, every thread) and each command's calls and time inside Redis (`INFO commandstats`), as the
//! difference between a snapshot taken before the run and one after.
//!
//! A Redis shard runs on one core, so Redis CPU per decision is what sets the size (and cost) of the
//! Redis fleet behind a rate limiter. Script calls are reported apart: they are the round trips
//! Tollgate makes (commands a script runs inside Redis are counted by Redis too, under their own names).

use std::collections::BTreeMap;
use std::fmt;

/// One `INFO cpu commandstats` reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RedisSnapshot {
    /// Process CPU (user + system) so far, in µs.
    cpu_us: f64,
    /// Per command: (calls, µs inside Redis).
    commands: BTreeMap<String, (u64, u64)>,
}

impl RedisSnapshot {
    /// Reads the snapshot from the Redis at `url`.
    pub(crate) async fn take(url: &str) -> anyhow::Result<Self> {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        Ok(Self::parse(&info))
    }

    fn parse(info: &str) -> Self {
        let mut snapshot = Self::default();
        for line in info.lines() {
            if let Some((name, value)) = line.split_once(':')
                && matches!(name, "used_cpu_sys" | "used_cpu_user")
            {
                snapshot.cpu_us += value.trim().parse::<f64>().unwrap_or(0.0) * 1e6;
            }
            let Some((name, stats)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
                continue;
            };
            let field = |key: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            snapshot
                .commands
                .insert(name.to_owned(), (field("calls="), field("usec=")));
        }
        snapshot
    }

    /// What happened between `before` and this snapshot.
    pub(crate) fn since(&self, before: &Self) -> RedisCost {
        let mut commands: Vec<(String, u64, u64)> = self
            .commands
            .iter()
            .filter_map(|(name, (calls, usec))| {
                let (calls_before, usec_before) = before.commands.get(name).copied().unwrap_or_default();
                let calls = calls.saturating_sub(calls_before);
                (calls > 0).then(|| (name.clone(), calls, usec.saturating_sub(usec_before)))
            })
            .collect();
        // Most expensive first.
        commands.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        RedisCost {
            cpu_us: (self.cpu_us - before.cpu_us).max(0.0),
            commands,
            decisions: 0,
        }
    }
}

/// Redis' side of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RedisCost {
    /// Redis process CPU over the run, µs.
    cpu_us: f64,
    /// (command, calls, µs inside Redis), most expensive first; the bench's own `INFO` calls included.
    commands: Vec<(String, u64, u64)>,
    /// The decisions (answered requests) to divide by.
    pub(crate) decisions: u64,
}

impl RedisCost {
    /// Client-issued script calls (`FCALL`, `EVALSHA`, `FUNCTION ...`, `SCRIPT ...`): round trips.
    fn script_calls(&self) -> u64 {
        self.commands
            .iter()
            .filter(|(name, ..)| {
                matches!(
                    name.as_str(),
                    "fcall" | "fcall_ro" | "evalsha" | "eval" | "evalsha_ro" | "eval_ro"
                ) || name.starts_with("function")
                    || name.starts_with("script")
            })
            .map(|(_, calls, _)| calls)
            .sum()
    }
}

impl fmt::Display for RedisCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let decisions = self.decisions.max(1) as f64;
        write!(
            f,
            "redis:       {:.2} µs process CPU per decision ({:.0} decisions/s per Redis core); {:.3} script calls per decision",
            self.cpu_us / decisions,
            decisions / (self.cpu_us.max(1.0) / 1e6),
            self.script_calls() as f64 / decisions,
        )?;
        for (name, calls, usec) in self.commands.iter().take(6) {
            write!(
                f,
                "\n  {name:<14} {:>7.3} calls/decision  {:>6.2} µs/decision  {:>7.2} µs/call",
                *calls as f64 / decisions,
                *usec as f64 / decisions,
                *usec as f64 / (*calls).max(1) as f64,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_costs_the_difference_between_two_readings() {
        let before = RedisSnapshot::parse(
            "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.000000\r\n# Commandstats\r\n\
             cmdstat_fcall:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n",
        );
        let after = RedisSnapshot::parse(
            "# CPU\r\nused_cpu_sys:1.600000\r\nused_cpu_user:2.100000\r\n# Commandstats\r\n\
             cmdstat_fcall:calls=20,usec=1100,usec_per_call=55.00,rejected_calls=0,failed_calls=0\r\n\
             cmdstat_incrby:calls=40,usec=80,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n",
        );
        let mut cost = after.since(&before);
        cost.decisions = 100;
        assert!((cost.cpu_us - 200_000.0).abs() < 1.0, "{}", cost.cpu_us);
        assert_eq!(
            cost.commands,
            [("fcall".to_owned(), 10, 1000), ("incrby".to_owned(), 40, 80)]
        );
        assert_eq!(cost.script_calls(), 10);
        let shown = cost.to_string();
        assert!(shown.contains("2000.00 µs process CPU per decision"), "{shown}");
    }
}
