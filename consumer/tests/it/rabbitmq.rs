//! The RabbitMQ consumer against a real broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotency_consumer::rabbitmq::{ATTEMPT_HEADER, REASON_HEADER, RabbitConsumer};
use idempotency_consumer::{Inbox, Incoming};
use idempotency_guard::engine::{Job, RunContext, Settle};
use idempotency_guard::{AbandonedPolicy, Engine, Fingerprint, RecordState, Store};
use idempotency_tests::names;
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Connection};
use tokio::sync::oneshot;

use crate::brokers::{Effects, declare_queue, delete_queues, eventually, rabbit, ready, unique};

/// Publishes one message with a message id.
async fn publish(connection: &Connection, queue: &str, id: &str, payload: &[u8]) {
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload,
            BasicProperties::default().with_message_id(id.into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

fn inbox<S: Store>(store: S) -> Inbox<S> {
    Inbox::new(Engine::new(store).with_retry_after(Duration::from_millis(100)))
        .with_retry_delay(Duration::from_millis(50))
}

/// Starts a consumer in a task of its own; dropping the sender stops it.
fn start<S: Store>(
    inbox: Inbox<S>,
    queue: &str,
    connection: Arc<Connection>,
    effects: Effects,
    calls: Arc<AtomicU32>,
    pause: Duration,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let consumer = RabbitConsumer::new(inbox, queue).with_concurrency(8);
    let task = tokio::spawn(async move {
        let handler = move |message: Incoming, _run: RunContext| {
            let effects = effects.clone();
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                if message.payload.as_ref() == b"poison" {
                    return Err("cannot parse the order");
                }
                effects.apply(&message.key);
                tokio::time::sleep(pause).await;
                Ok(())
            }
        };
        let _ = consumer
            .run(&connection, handler, async move {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, task)
}

pub(crate) async fn two_consumers_racing_on_duplicates_apply_one_effect<S: Store>(store: S) {
    let connection = Arc::new(rabbit().await);
    let queue = unique("race");
    let _cleanup = declare_queue(&connection, &queue).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    // Two consumers on two connections, on one queue.
    let second = Arc::new(rabbit().await);
    let pause = Duration::from_millis(100);
    let a = start(
        inbox(store.clone()),
        &queue,
        Arc::clone(&connection),
        effects.clone(),
        Arc::clone(&calls),
        pause,
    );
    let b = start(
        inbox(store.clone()),
        &queue,
        Arc::clone(&second),
        effects.clone(),
        Arc::clone(&calls),
        pause,
    );
    // One key published ten times at once, and twenty keys twice each.
    for _ in 0..10 {
        publish(&connection, &queue, "order-1", br#"{"order":1}"#).await;
    }
    for n in 0..20 {
        for _ in 0..2 {
            publish(
                &connection,
                &queue,
                &format!("order-x{n}"),
                format!("{{\"order\":\"x{n}\"}}").as_bytes(),
            )
            .await;
        }
    }
    eventually(Duration::from_secs(30), "every key's effect", || async {
        effects.keys() == 21
    })
    .await;
    // Let every duplicate come back (requeued after the in-flight hint) and be acked.
    let mut quiet = 0;
    eventually(Duration::from_secs(30), "an empty queue", || {
        let connection = Arc::clone(&connection);
        let queue = queue.clone();
        quiet += 1;
        async move { ready(&connection, &queue).await == 0 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        ready(&connection, &queue).await,
        0,
        "every duplicate was acked"
    );
    assert_eq!(
        effects.of("order-1"),
        1,
        "ten copies of one key, one effect"
    );
    assert!(
        effects.duplicated().is_empty(),
        "no key applied twice: {:?}",
        effects.duplicated()
    );
    assert_eq!(
        store
            .get(names::scope(&queue), names::key("order-1"))
            .await
            .unwrap()
            .unwrap()
            .state(),
        RecordState::Completed
    );
    drop((a.0, b.0));
    let _ = tokio::join!(a.1, b.1);
    delete_queues(&connection, &queue).await;
    assert!(quiet > 0);
}

pub(crate) async fn a_lost_ack_is_answered_from_the_stored_outcome<S: Store>(store: S) {
    let admin = rabbit().await;
    let queue = unique("ackloss");
    let _cleanup = declare_queue(&admin, &queue).await;
    let effects = Effects::default();
    // Consumer A applies the effect, and its connection is cut before its ack.
    let first = Arc::new(rabbit().await);
    let first_calls = Arc::new(AtomicU32::new(0));
    let a = start(
        inbox(store.clone()),
        &queue,
        Arc::clone(&first),
        effects.clone(),
        Arc::clone(&first_calls),
        Duration::from_millis(300),
    );
    publish(&admin, &queue, "order-7", br#"{"order":7}"#).await;
    eventually(Duration::from_secs(10), "the first effect", || async {
        effects.of("order-7") == 1
    })
    .await;
    first
        .close(320, "cut after the effect".into())
        .await
        .unwrap();
    // The engine still stores the outcome of the run it owns.
    eventually(Duration::from_secs(10), "the stored outcome", || {
        let store = store.clone();
        let queue = queue.clone();
        async move {
            matches!(store.get(names::scope(&queue), names::key("order-7")).await, Ok(Some(record)) if record.state() == RecordState::Completed)
        }
    })
    .await;
    let _ = a.1.await;
    // The broker redelivers to consumer B: acked from the stored outcome.
    let second = Arc::new(rabbit().await);
    let second_calls = Arc::new(AtomicU32::new(0));
    let b = start(
        inbox(store.clone()),
        &queue,
        Arc::clone(&second),
        effects.clone(),
        Arc::clone(&second_calls),
        Duration::ZERO,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(ready(&admin, &queue).await, 0, "the redelivery was acked");
    assert_eq!(effects.of("order-7"), 1, "one effect");
    assert_eq!(
        second_calls.load(Ordering::SeqCst),
        0,
        "the redelivery did not run the handler"
    );
    drop(b.0);
    let _ = b.1.await;
    // Nothing unacked left behind either: a fresh get finds the queue empty.
    let channel = admin.create_channel().await.unwrap();
    assert!(
        channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    delete_queues(&admin, &queue).await;
}

pub(crate) async fn a_poison_message_is_dead_lettered_and_the_queue_flows<S: Store>(store: S) {
    let connection = Arc::new(rabbit().await);
    let queue = unique("poison");
    let _cleanup = declare_queue(&connection, &queue).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    let inbox = inbox(store.clone()).with_max_attempts(3);
    let consumer = start(
        inbox,
        &queue,
        Arc::clone(&connection),
        effects.clone(),
        Arc::clone(&calls),
        Duration::ZERO,
    );
    publish(&connection, &queue, "bad-1", b"poison").await;
    for n in 0..10 {
        publish(
            &connection,
            &queue,
            &format!("good-{n}"),
            format!("{{\"n\":{n}}}").as_bytes(),
        )
        .await;
    }
    let dead = format!("{queue}.dead");
    eventually(Duration::from_secs(20), "the dead letter", || {
        let connection = Arc::clone(&connection);
        let dead = dead.clone();
        async move { ready(&connection, &dead).await == 1 }
    })
    .await;
    eventually(Duration::from_secs(10), "the good messages", || async {
        effects.keys() == 10
    })
    .await;
    // Three attempts, then dead-lettered with its reason, its key released.
    assert_eq!(calls.load(Ordering::SeqCst), 3 + 10);
    let channel = connection.create_channel().await.unwrap();
    let letter = channel
        .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the dead letter");
    assert_eq!(letter.data, b"poison");
    let headers = letter.properties.headers().clone().unwrap();
    assert_eq!(
        headers.inner().get(REASON_HEADER),
        Some(&AMQPValue::LongString("poison".into()))
    );
    assert_eq!(
        headers.inner().get(ATTEMPT_HEADER),
        Some(&AMQPValue::LongUInt(3))
    );
    assert!(
        store
            .get(names::scope(&queue), names::key("bad-1"))
            .await
            .unwrap()
            .is_none(),
        "the poison key was released"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ready(&connection, &queue).await,
        0,
        "no loop: the queue is empty"
    );
    drop(consumer.0);
    let _ = consumer.1.await;
    delete_queues(&connection, &queue).await;
}

pub(crate) async fn an_abandoned_key_is_parked_not_run<S: Store>(store: S) {
    let connection = Arc::new(rabbit().await);
    let queue = unique("parked");
    let _cleanup = declare_queue(&connection, &queue).await;
    let payload = br#"{"order":9}"#;
    // An earlier run of order-9 lost track of its outcome.
    let engine = Engine::new(store.clone());
    let job = Job::new(
        idempotency_guard::Scope::new(queue.clone()).expect("a valid scope"),
        "order-9".parse().expect("a valid key"),
        Fingerprint::of_bytes(payload),
    );
    engine
        .run(job, |_run| async { Settle::Abandon { reply: () } })
        .await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    let consumer = start(
        inbox(store.clone()),
        &queue,
        Arc::clone(&connection),
        effects.clone(),
        Arc::clone(&calls),
        Duration::ZERO,
    );
    publish(&connection, &queue, "order-9", payload).await;
    let parked = format!("{queue}.parked");
    eventually(Duration::from_secs(10), "the parked message", || {
        let connection = Arc::clone(&connection);
        let parked = parked.clone();
        async move { ready(&connection, &parked).await == 1 }
    })
    .await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "an unknown outcome is never run again blindly"
    );
    assert_eq!(ready(&connection, &queue).await, 0);
    assert_eq!(
        store
            .get(names::scope(&queue), names::key("order-9"))
            .await
            .unwrap()
            .unwrap()
            .state(),
        RecordState::Abandoned
    );
    drop(consumer.0);
    let _ = consumer.1.await;
    delete_queues(&connection, &queue).await;
}

pub(crate) async fn a_copy_behind_its_twin_waits_without_holding_a_slot<S: Store>(store: S) {
    let connection = Arc::new(rabbit().await);
    let queue = unique("twin");
    let _cleanup = declare_queue(&connection, &queue).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    // The engine's "in flight" hint is long: a copy that heard it would
    // hold its slot for 10 s before being requeued.
    let inbox = Inbox::new(Engine::new(store.clone()).with_retry_after(Duration::from_secs(10)));
    let (open_gate, gate) = tokio::sync::watch::channel(false);
    let (stop, stopped) = oneshot::channel::<()>();
    let consumer = RabbitConsumer::new(inbox, queue.as_str()).with_concurrency(2);
    let task = {
        let connection = Arc::clone(&connection);
        let effects = effects.clone();
        let calls = Arc::clone(&calls);
        tokio::spawn(async move {
            let handler = move |message: Incoming, _run: RunContext| {
                let effects = effects.clone();
                let calls = Arc::clone(&calls);
                let mut gate = gate.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if message.key == "slow" {
                        // Runs until the test opens the gate.
                        let _ = gate.wait_for(|open| *open).await;
                    }
                    effects.apply(&message.key);
                    Ok::<(), String>(())
                }
            };
            consumer
                .run(&connection, handler, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        })
    };
    publish(&connection, &queue, "slow", b"{\"order\":\"slow\"}").await;
    eventually(
        Duration::from_secs(10),
        "the first copy running",
        || async { calls.load(Ordering::SeqCst) == 1 },
    )
    .await;
    // Its copy arrives while it runs, then other orders.
    publish(&connection, &queue, "slow", b"{\"order\":\"slow\"}").await;
    for n in 0..3 {
        publish(&connection, &queue, &format!("fast-{n}"), b"{}").await;
    }
    eventually(
        Duration::from_secs(5),
        "the other orders run while the copy waits for its twin (it holds no slot)",
        || async { (0..3).all(|n| effects.of(&format!("fast-{n}")) == 1) },
    )
    .await;
    assert_eq!(effects.of("slow"), 0, "the first copy still runs");
    open_gate.send(true).unwrap();
    eventually(
        Duration::from_secs(5),
        "the first copy's effect",
        || async { effects.of("slow") == 1 },
    )
    .await;
    // Stopping lets the deliveries in hand finish: the copy is answered
    // from the stored outcome and acked, not requeued after the hint.
    drop(stop);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the copy does not sit out the 10 s hint")
        .unwrap();
    assert_eq!(ready(&connection, &queue).await, 0, "every copy acked");
    assert_eq!(effects.of("slow"), 1, "two copies, one effect");
    assert_eq!(calls.load(Ordering::SeqCst), 4, "the copy ran no handler");
}

/// A scope no store can hold (here 300 bytes) is the message's fault, not
/// the store's: it is dead-lettered with its reason once, its handler never
/// runs, nothing is stored, and it is not redelivered (on PostgreSQL it
/// used to hit the check constraint and come back forever; Redis took it).
pub(crate) async fn an_over_long_scope_is_dead_lettered_not_redelivered<S: Store>(store: S) {
    let connection = Arc::new(rabbit().await);
    let queue = unique("long-scope");
    let _cleanup = declare_queue(&connection, &queue).await;
    let calls = Arc::new(AtomicU32::new(0));
    let long_scope = "s".repeat(300);
    let consumer = RabbitConsumer::new(inbox(store.clone()), &queue)
        .with_scope(move |_queue, _payload| long_scope.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = {
        let (connection, calls) = (Arc::clone(&connection), Arc::clone(&calls));
        tokio::spawn(async move {
            let handler = move |_message: Incoming, _run: RunContext| {
                let calls = Arc::clone(&calls);
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), &str>(())
                }
            };
            let _ = consumer
                .run(&connection, handler, async move {
                    let _ = stopped.await;
                })
                .await;
        })
    };
    publish(&connection, &queue, "order-1", b"{}").await;
    let dead = format!("{queue}.dead");
    eventually(Duration::from_secs(20), "the dead letter", || {
        let connection = Arc::clone(&connection);
        let dead = dead.clone();
        async move { ready(&connection, &dead).await == 1 }
    })
    .await;
    let channel = connection.create_channel().await.unwrap();
    let letter = channel
        .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the dead letter");
    let headers = letter.properties.headers().clone().unwrap();
    assert_eq!(
        headers.inner().get(REASON_HEADER),
        Some(&AMQPValue::LongString("scope-invalid".into()))
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(ready(&connection, &queue).await, 0, "not redelivered");
    // Nothing stored: the store takes a typed `Scope`, which refuses this
    // one, so no claim under it can reach a store.
    assert!(
        idempotency_guard::Scope::new("s".repeat(300)).is_err(),
        "a 300-byte scope is not a scope"
    );
    drop(stop);
    let _ = task.await;
    delete_queues(&connection, &queue).await;
}

/// A handler that fails after a recorded step, on an engine that resumes
/// abandoned runs: the key is abandoned with its step kept, the message
/// comes back (a failed attempt), and the next copy resumes from the step
/// (which never runs again) and is acked; nothing is parked.
pub(crate) async fn a_run_that_fails_after_a_step_resumes_on_the_next_copy<S: Store>(store: S) {
    let connection = Arc::new(rabbit().await);
    let queue = unique("resume");
    let _cleanup = declare_queue(&connection, &queue).await;
    let engine = Engine::new(store.clone())
        .with_retry_after(Duration::from_millis(100))
        .with_abandoned(AbandonedPolicy::Resume);
    let inbox = Inbox::new(engine).with_retry_delay(Duration::from_millis(50));
    let steps = Arc::new(AtomicU32::new(0));
    let calls = Arc::new(AtomicU32::new(0));
    let (stop, stopped) = oneshot::channel::<()>();
    let consumer = RabbitConsumer::new(inbox, &queue).with_concurrency(2);
    let task = {
        let (steps, calls, connection) = (
            Arc::clone(&steps),
            Arc::clone(&calls),
            Arc::clone(&connection),
        );
        tokio::spawn(async move {
            let handler = move |_message: Incoming, run: RunContext| {
                let (steps, calls) = (Arc::clone(&steps), Arc::clone(&calls));
                async move {
                    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let charged: u32 = run
                        .step("charge", || async {
                            steps.fetch_add(1, Ordering::SeqCst);
                            7
                        })
                        .await
                        .map_err(|error| error.to_string())?;
                    if call == 1 {
                        return Err("the ledger was down".to_owned());
                    }
                    assert_eq!(charged, 7, "the recorded result");
                    Ok(())
                }
            };
            let _ = consumer
                .run(&connection, handler, async move {
                    let _ = stopped.await;
                })
                .await;
        })
    };
    publish(&connection, &queue, "order-5", br#"{"order":5}"#).await;
    eventually(Duration::from_secs(20), "the key completed", || {
        let store = store.clone();
        let queue = queue.clone();
        async move {
            store
                .get(names::scope(&queue), names::key("order-5"))
                .await
                .ok()
                .flatten()
                .is_some_and(|record| record.state() == RecordState::Completed)
        }
    })
    .await;
    assert_eq!(steps.load(Ordering::SeqCst), 1, "the step ran once");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the handler ran twice");
    eventually(Duration::from_secs(10), "the queue drained", || {
        let connection = Arc::clone(&connection);
        let queue = queue.clone();
        async move { ready(&connection, &queue).await == 0 }
    })
    .await;
    assert_eq!(ready(&connection, &format!("{queue}.parked")).await, 0);
    drop(stop);
    let _ = task.await;
    delete_queues(&connection, &queue).await;
}
