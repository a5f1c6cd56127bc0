//! An application deciding in-process with the example rules (`examples/config`): eleven login
//! attempts from one IPv6 /64, of which ten pass. With `REDIS_URL` set it counts in that Redis, where a
//! Tollgate fleet serving the same rules counts too; otherwise in the embedded store.
//!
//! ```sh
//! cargo run -p tollgate-core --example embedded
//! REDIS_URL=127.0.0.1:6379 cargo run -p tollgate-core --example embedded
//! ```

use std::time::{Duration, Instant};

use tollgate_core::embedded::{Descriptor, LimiterBuilder};
use tollgate_core::limiter::{Code, Mode};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/config");
    let mut builder = LimiterBuilder::new().rules_dir(rules);
    if let Ok(url) = std::env::var("REDIS_URL") {
        builder = builder.redis_url(url);
    }
    let limiter = builder.build()?;
    let login = |address: &str| {
        [Descriptor::new([
            ("path", "/auth/login"),
            ("remote_address", address),
        ])]
    };
    // Redis connects in the background; a peek, which counts nothing, tells when it answers.
    let waiting = Instant::now();
    while let Err(error) = limiter.check("api", &login("2001:db8::1"), 0, Mode::Peek).await {
        if waiting.elapsed() > Duration::from_secs(5) {
            return Err(error.into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for attempt in 1..=11 {
        // Every address of 2001:db8:1:2::/64 shares one budget (`ip_prefix: {v6: 64}`).
        let address = format!("2001:db8:1:2::{attempt:x}");
        let verdict = limiter.check("api", &login(&address), 1, Mode::Consume).await?;
        let status = &verdict.statuses[0];
        match verdict.overall {
            Code::Ok => println!(
                "attempt {attempt} from {address}: allowed, {} left",
                status.remaining
            ),
            Code::OverLimit => println!(
                "attempt {attempt} from {address}: refused, retry in {:?}",
                status.retry_after.unwrap_or_default()
            ),
        }
    }
    Ok(())
}
