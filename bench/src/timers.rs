//! What one timer costs a request. A guarded request arms a few: the
//! lease's first renewal (`tokio::time::timeout` around the work, a third
//! of the lease), each store call's timeout (claim, complete), and the
//! Redis client's own response timeout. Each is registered in tokio's
//! timer wheel when first polled and removed when dropped before it fires,
//! which is what happens to nearly all of them. This times exactly that,
//! in a task of the same multi-threaded runtime the server uses, to decide
//! whether the renewals must leave the request path (issue 40: move them
//! to one engine-wide task if a timer costs more than a microsecond).

use std::future::Future as _;
use std::pin::pin;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use crate::cli::TimersArgs;

/// One round: `iterations` sleeps of `length`, each polled once (which
/// registers it) and dropped (which cancels it); the mean per timer.
fn round(iterations: u32, length: Duration) -> Duration {
    let mut context = Context::from_waker(Waker::noop());
    let started = Instant::now();
    for _ in 0..iterations {
        let mut sleep = pin!(tokio::time::sleep(length));
        assert!(sleep.as_mut().poll(&mut context).is_pending());
    }
    started.elapsed() / iterations
}

/// Prints the cost of one registered and cancelled timer.
pub(crate) async fn run(args: TimersArgs) -> anyhow::Result<()> {
    // Lengths as the guard arms them: a store timeout (2 s), the lease's
    // first renewal (20 s of the default 60 s lease).
    for length in [Duration::from_secs(2), Duration::from_secs(20)] {
        let iterations = args.iterations.max(1);
        let mut rounds = tokio::task::spawn(async move {
            (0..args.rounds.max(1))
                .map(|_| round(iterations, length))
                .collect::<Vec<_>>()
        })
        .await?;
        rounds.sort();
        println!(
            "a {length:?} timer registered and cancelled: median {:?} (from {:?} to {:?}) over {} rounds of {iterations}",
            rounds[rounds.len() / 2],
            rounds[0],
            rounds[rounds.len() - 1],
            rounds.len(),
        );
    }
    println!("(cargo run --release -p idempotency-bench -- timers)");
    Ok(())
}
