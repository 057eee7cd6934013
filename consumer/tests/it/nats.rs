//! The NATS JetStream consumer against a real server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, consumer, stream};
use idempotency_consumer::nats::{JetStreamConsumer, REASON_HEADER};
use idempotency_consumer::{Inbox, Incoming, KeySource};
use idempotency_guard::engine::RunContext;
use idempotency_guard::{Engine, RecordState, Store};
use idempotency_tests::names;
use tokio::sync::oneshot;

use crate::brokers::{Effects, eventually, nats, unique};

/// A stream of the test's own (`<name>.in` for work, `.dead` and
/// `.parked` for what is set aside), gone after ten minutes at most, and a
/// durable pull consumer of its `.in` subject.
struct TestStream {
    context: jetstream::Context,
    name: String,
}

impl TestStream {
    async fn create(ack_wait: Duration) -> Self {
        let context = jetstream::new(nats().await);
        let name = unique("S");
        context
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![
                    format!("{name}.in"),
                    format!("{name}.dead"),
                    format!("{name}.parked"),
                ],
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .unwrap();
        let stream = context.get_stream(&name).await.unwrap();
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("work".to_owned()),
                filter_subject: format!("{name}.in"),
                ack_wait,
                ..Default::default()
            })
            .await
            .unwrap();
        Self { context, name }
    }

    async fn consumer(&self) -> PullConsumer {
        let stream = self.context.get_stream(&self.name).await.unwrap();
        stream.get_consumer("work").await.unwrap()
    }

    async fn publish(&self, order: &str, payload: &[u8]) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Order-Id", order);
        self.context
            .publish_with_headers(
                format!("{}.in", self.name),
                headers,
                payload.to_vec().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// Messages not yet delivered plus those delivered and not acked.
    async fn outstanding(&self) -> u64 {
        let mut consumer = self.consumer().await;
        let info = consumer.info().await.unwrap();
        info.num_pending + u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX)
    }

    async fn delete(self) {
        self.context.delete_stream(&self.name).await.unwrap();
    }
}

impl Drop for TestStream {
    /// Deletes the stream even when the test panicked (a second delete
    /// after [`TestStream::delete`] finds nothing).
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(crate::brokers::nats_url()).await {
                    let _ = jetstream::new(client).delete_stream(&name).await;
                }
            });
        })
        .join();
    }
}

fn inbox<S: Store>(store: S) -> Inbox<S> {
    Inbox::new(Engine::new(store).with_retry_after(Duration::from_millis(100)))
        .with_retry_delay(Duration::from_millis(50))
}

/// Starts a consumer in a task of its own; dropping the sender stops it.
async fn start<S: Store>(
    inbox: Inbox<S>,
    stream: &TestStream,
    effects: Effects,
    calls: Arc<AtomicU32>,
    pause: Duration,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let pull = stream.consumer().await;
    let consumer = JetStreamConsumer::new(inbox, stream.name.clone(), stream.context.clone())
        .with_key(KeySource::Header("Order-Id".to_owned()))
        .with_concurrency(8);
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
            .run(pull, handler, async move {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, task)
}

pub(crate) async fn two_consumers_racing_on_duplicates_apply_one_effect<S: Store>(store: S) {
    let stream = TestStream::create(Duration::from_secs(30)).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    let pause = Duration::from_millis(100);
    let a = start(
        inbox(store.clone()),
        &stream,
        effects.clone(),
        Arc::clone(&calls),
        pause,
    )
    .await;
    let b = start(
        inbox(store.clone()),
        &stream,
        effects.clone(),
        Arc::clone(&calls),
        pause,
    )
    .await;
    for _ in 0..10 {
        stream.publish("order-1", br#"{"order":1}"#).await;
    }
    for n in 0..20 {
        for _ in 0..2 {
            stream
                .publish(
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
    eventually(Duration::from_secs(30), "every copy acked", || async {
        stream.outstanding().await == 0
    })
    .await;
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
            .get(names::scope(&stream.name), names::key("order-1"))
            .await
            .unwrap()
            .unwrap()
            .state(),
        RecordState::Completed
    );
    drop((a.0, b.0));
    let _ = tokio::join!(a.1, b.1);
    stream.delete().await;
}

pub(crate) async fn a_lost_ack_is_answered_from_the_stored_outcome<S: Store>(store: S) {
    // JetStream redelivers what is not acked within two seconds.
    let stream = TestStream::create(Duration::from_secs(2)).await;
    let effects = Effects::default();
    let first_calls = Arc::new(AtomicU32::new(0));
    let a = start(
        inbox(store.clone()),
        &stream,
        effects.clone(),
        Arc::clone(&first_calls),
        Duration::from_millis(300),
    )
    .await;
    stream.publish("order-7", br#"{"order":7}"#).await;
    eventually(Duration::from_secs(10), "the first effect", || async {
        effects.of("order-7") == 1
    })
    .await;
    // Consumer A dies after the effect: its ack is never sent.
    a.1.abort();
    eventually(Duration::from_secs(10), "the stored outcome", || {
        let store = store.clone();
        let name = stream.name.clone();
        async move {
            matches!(store.get(names::scope(&name), names::key("order-7")).await, Ok(Some(record)) if record.state() == RecordState::Completed)
        }
    })
    .await;
    let second_calls = Arc::new(AtomicU32::new(0));
    let b = start(
        inbox(store.clone()),
        &stream,
        effects.clone(),
        Arc::clone(&second_calls),
        Duration::ZERO,
    )
    .await;
    eventually(Duration::from_secs(15), "the redelivery acked", || async {
        stream.outstanding().await == 0
    })
    .await;
    assert_eq!(effects.of("order-7"), 1, "one effect");
    assert_eq!(
        second_calls.load(Ordering::SeqCst),
        0,
        "the redelivery did not run the handler"
    );
    drop((a.0, b.0));
    let _ = b.1.await;
    stream.delete().await;
}

pub(crate) async fn a_poison_message_is_dead_lettered_and_the_stream_flows<S: Store>(store: S) {
    let stream = TestStream::create(Duration::from_secs(30)).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    let consumer = start(
        inbox(store.clone()).with_max_attempts(3),
        &stream,
        effects.clone(),
        Arc::clone(&calls),
        Duration::ZERO,
    )
    .await;
    stream.publish("bad-1", b"poison").await;
    for n in 0..10 {
        stream
            .publish(&format!("good-{n}"), format!("{{\"n\":{n}}}").as_bytes())
            .await;
    }
    eventually(Duration::from_secs(10), "the good messages", || async {
        effects.keys() == 10
    })
    .await;
    eventually(Duration::from_secs(20), "every message settled", || async {
        stream.outstanding().await == 0
    })
    .await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3 + 10,
        "three attempts, then no more"
    );
    let js_stream = stream.context.get_stream(&stream.name).await.unwrap();
    let letter = js_stream
        .get_last_raw_message_by_subject(&format!("{}.dead", stream.name))
        .await
        .unwrap();
    assert_eq!(letter.payload.as_ref(), b"poison");
    assert_eq!(
        letter.headers.get(REASON_HEADER).map(|v| v.as_str()),
        Some("poison")
    );
    assert!(
        store
            .get(names::scope(&stream.name), names::key("bad-1"))
            .await
            .unwrap()
            .is_none(),
        "the poison key was released"
    );
    drop(consumer.0);
    let _ = consumer.1.await;
    stream.delete().await;
}

pub(crate) async fn a_message_in_hand_is_kept_alive_past_its_ack_wait<S: Store>(store: S) {
    // JetStream would send the message again after 1 s: the handler takes 3 s.
    let stream = TestStream::create(Duration::from_secs(1)).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    let consumer = start(
        inbox(store.clone()),
        &stream,
        effects.clone(),
        Arc::clone(&calls),
        Duration::from_secs(3),
    )
    .await;
    stream.publish("order-slow", br#"{"order":"slow"}"#).await;
    eventually(Duration::from_secs(15), "the message acked", || async {
        effects.of("order-slow") == 1 && stream.outstanding().await == 0
    })
    .await;
    let info = stream.consumer().await.info().await.unwrap().clone();
    assert_eq!(
        info.num_redelivered, 0,
        "in_progress heartbeats kept the message from being sent again"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    drop(consumer.0);
    let _ = consumer.1.await;
    stream.delete().await;
}

pub(crate) async fn a_dead_consumers_messages_come_back_within_the_ack_wait<S: Store>(store: S) {
    let stream = TestStream::create(Duration::from_secs(30)).await;
    let adapter = JetStreamConsumer::new(
        inbox(store.clone()),
        stream.name.clone(),
        stream.context.clone(),
    )
    .with_key(KeySource::Header("Order-Id".to_owned()))
    .with_concurrency(2)
    .with_ack_wait(Duration::from_secs(1));
    let config = consumer::pull::Config {
        filter_subject: format!("{}.in", stream.name),
        ..adapter.pull_config("derived")
    };
    assert_eq!(config.ack_wait, Duration::from_secs(1));
    assert_eq!(
        config.max_ack_pending,
        i64::try_from(2 * idempotency_consumer::nats::MESSAGES_PER_SLOT).unwrap(),
        "a few messages in hand per handler slot, not JetStream's 1,000"
    );
    let js_stream = stream.context.get_stream(&stream.name).await.unwrap();
    let pull: PullConsumer = js_stream.create_consumer(config).await.unwrap();
    for n in 0..5 {
        stream.publish(&format!("order-{n}"), b"{}").await;
    }
    // A consumer pulls everything it may and dies before running any of it.
    let mut dead = pull.fetch().max_messages(10).messages().await.unwrap();
    let mut pulled = 0;
    while let Ok(Some(Ok(_message))) = tokio::time::timeout(
        Duration::from_secs(2),
        futures_util::StreamExt::next(&mut dead),
    )
    .await
    {
        pulled += 1;
    }
    assert!(
        pulled >= 4,
        "the dead consumer had the messages in hand: {pulled}"
    );
    drop(dead);
    let effects = Effects::default();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = {
        let effects = effects.clone();
        tokio::spawn(async move {
            let handler = move |message: Incoming, _run: RunContext| {
                let effects = effects.clone();
                async move {
                    effects.apply(&message.key);
                    Ok::<(), String>(())
                }
            };
            adapter
                .run(pull, handler, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        })
    };
    eventually(
        Duration::from_secs(10),
        "every message the dead consumer held, sent again after the 1 s ack wait and run",
        || async { effects.keys() == 5 },
    )
    .await;
    assert!(effects.duplicated().is_empty());
    drop(stop);
    let _ = task.await;
    stream.delete().await;
}
