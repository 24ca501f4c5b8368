//! The appender: puts queued with `submit` are appended together, in order, by whoever polls
//! (or drains) first, and complete only when durable under sync flush.

mod common;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use common::*;
use shoal_store::backend::MemBackend;
use shoal_store::{FlushMode, FlushStatus, MessageStore, PutFuture, StoreError};

fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on this thread.
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

fn ids(body: &[u8]) -> Vec<String> {
    decode(body).into_iter().map(|r| r.id).collect()
}

#[test]
fn queued_puts_are_appended_together_in_order() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut futs: Vec<Pin<Box<PutFuture>>> = (0..3)
        .map(|i| Box::pin(store.submit(vec![msg("T", 0, &format!("m{i}"), 40, "a")])))
        .collect();
    // First polls only queue the puts (each task lets the others queue theirs).
    for f in &mut futs {
        assert!(poll_once(f.as_mut()).is_pending());
    }
    assert_eq!(store.max_offset("T", 0), 0, "nothing appended yet");
    // The next poll appends every queued put at once.
    let first = match poll_once(futs[0].as_mut()) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("the first put did not complete"),
    };
    assert_eq!(store.max_offset("T", 0), 3);
    assert_eq!(first.messages[0].queue_offset, 0);
    assert_eq!(first.flush, FlushStatus::NotFlushed);
    for (i, f) in futs.iter_mut().enumerate().skip(1) {
        match poll_once(f.as_mut()) {
            Poll::Ready(r) => assert_eq!(r.unwrap().messages[0].queue_offset, i as u64),
            Poll::Pending => panic!("put {i} was not completed with the first"),
        }
    }
    let got = store
        .get_messages("T", 0, 0, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(ids(&got.messages), vec!["m0", "m1", "m2"]);
}

/// Counts its wake-ups.
#[derive(Default)]
struct Count(std::sync::atomic::AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn woken(c: &Arc<Count>) -> usize {
    c.0.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn only_the_put_that_found_the_queue_empty_asks_to_be_polled_again() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let counts: Vec<Arc<Count>> = (0..3).map(|_| Arc::new(Count::default())).collect();
    let mut futs: Vec<Pin<Box<PutFuture>>> = (0..3)
        .map(|i| Box::pin(store.submit(vec![msg("T", 0, &format!("m{i}"), 40, "")])))
        .collect();
    for (f, c) in futs.iter_mut().zip(&counts) {
        let waker = Waker::from(c.clone());
        assert!(f
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    // The first asks for its next poll (which appends all three); the others do not make
    // their task (a connection polling its requests together) yield.
    assert_eq!(counts.iter().map(woken).collect::<Vec<_>>(), vec![1, 0, 0]);
    let waker = Waker::from(counts[0].clone());
    assert!(futs[0]
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_ready());
    assert_eq!(store.max_offset("T", 0), 3);
    // The others are woken by their completion.
    assert_eq!(woken(&counts[1]), 1);
    assert_eq!(woken(&counts[2]), 1);
    for f in futs.iter_mut().skip(1) {
        assert!(matches!(poll_once(f.as_mut()), Poll::Ready(Ok(_))));
    }
}

#[test]
fn a_queued_put_dropped_before_its_next_poll_appends_the_queue() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut first = Box::pin(store.submit(vec![msg("T", 0, "dropped", 40, "")]));
    let mut behind = Box::pin(store.submit(vec![msg("T", 0, "behind", 40, "")]));
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    assert!(poll_once(first.as_mut()).is_pending());
    assert!(behind
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    assert_eq!(woken(&count), 0);
    // The put whose next poll was to append the queue goes away (its request was
    // cancelled): the queue is appended now, its own put included (it cannot be taken back).
    drop(first);
    assert_eq!(store.max_offset("T", 0), 2);
    assert_eq!(woken(&count), 1);
    match poll_once(behind.as_mut()) {
        Poll::Ready(r) => assert_eq!(r.unwrap().messages[0].queue_offset, 1),
        Poll::Pending => panic!("the put behind the dropped one was left waiting"),
    }
}

#[test]
fn drain_and_blocking_puts_take_queued_puts_along() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut a = Box::pin(store.submit(vec![msg("T", 1, "a", 40, "")]));
    assert!(
        !store.appends_queued(),
        "queued on its first poll, not before"
    );
    assert!(poll_once(a.as_mut()).is_pending());
    assert!(store.appends_queued());
    // An explicit drain (a connection ending its batch) appends it.
    store.drain_appends();
    assert!(!store.appends_queued());
    assert_eq!(store.max_offset("T", 1), 1);
    assert!(matches!(poll_once(a.as_mut()), Poll::Ready(Ok(_))));

    // A blocking put appends the queued ones together with its own, queued first.
    let mut b = Box::pin(store.submit(vec![msg("T", 1, "b", 40, "")]));
    assert!(poll_once(b.as_mut()).is_pending());
    let own = store.put_message(&msg("T", 1, "c", 40, "")).unwrap();
    assert_eq!(own.messages[0].queue_offset, 1);
    match poll_once(b.as_mut()) {
        Poll::Ready(r) => assert_eq!(r.unwrap().messages[0].queue_offset, 2),
        Poll::Pending => panic!("the queued put was left behind"),
    }
    let got = store
        .get_messages("T", 1, 0, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(ids(&got.messages), vec!["a", "c", "b"]);
}

#[test]
fn bad_puts_fail_alone() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut bad = Box::pin(store.submit(vec![msg("bad topic", 0, "x", 40, "")]));
    let mut big = Box::pin(store.submit(vec![msg("T", 0, "y", 4000, "")]));
    let mut good = Box::pin(store.submit(vec![msg("T", 0, "z", 40, "")]));
    assert!(matches!(
        poll_once(bad.as_mut()),
        Poll::Ready(Err(StoreError::InvalidArgument(_)))
    ));
    assert!(matches!(
        poll_once(big.as_mut()),
        Poll::Ready(Err(StoreError::MessageTooLarge { .. }))
    ));
    assert!(poll_once(good.as_mut()).is_pending());
    assert!(matches!(poll_once(good.as_mut()), Poll::Ready(Ok(_))));
    assert!(matches!(
        poll_once(Box::pin(store.submit(Vec::new())).as_mut()),
        Poll::Ready(Err(StoreError::InvalidArgument(_)))
    ));
}

#[test]
fn sync_flush_completes_after_the_group_fsync() {
    let be = MemBackend::new();
    let mut config = mem_config(&be, FlushMode::Sync);
    config.background_threads = true;
    let (store, _) = MessageStore::open(config).unwrap();
    let store = Arc::new(store);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..20)
                    .map(|i| {
                        let r =
                            block_on(store.submit(vec![msg("S", t, &format!("{t}-{i}"), 40, "")]))
                                .unwrap();
                        // Acknowledged only once durable.
                        assert_eq!(r.flush, FlushStatus::Flushed);
                        let m = &r.messages[0];
                        assert!(
                            store.commit_log_flushed_offset()
                                >= m.physical_offset + u64::from(m.size)
                        );
                        m.queue_offset
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), (0..20).collect::<Vec<u64>>());
    }
    assert!(be.sync_count() >= 1);
    // Fewer fsyncs than puts would be group commit; it depends on timing, so only the
    // durability of every acknowledged put is asserted.
    store.shutdown().unwrap();
}

#[test]
fn shutdown_fails_puts_still_queued() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut f = Box::pin(store.submit(vec![msg("T", 0, "late", 40, "")]));
    assert!(poll_once(f.as_mut()).is_pending());
    store.shutdown().unwrap();
    assert!(matches!(
        poll_once(f.as_mut()),
        Poll::Ready(Err(StoreError::Closed))
    ));
    assert!(matches!(
        poll_once(Box::pin(store.submit(vec![msg("T", 0, "after", 40, "")])).as_mut()),
        Poll::Ready(Err(StoreError::Closed))
    ));
}

#[test]
fn one_append_over_many_queues_keeps_each_queues_order_and_index() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    // 40 queues (more than an append finds by scanning), three rounds of puts interleaved
    // across them, all queued before one drain appends them together.
    let mut futs: Vec<Pin<Box<PutFuture>>> = Vec::new();
    for round in 0..3 {
        for q in 0..40 {
            let topic = if q % 2 == 0 { "Even" } else { "Odd" };
            futs.push(Box::pin(store.submit(vec![msg(
                topic,
                q,
                &format!("q{q}-r{round}"),
                40,
                "",
            )])));
        }
    }
    for f in &mut futs {
        assert!(poll_once(f.as_mut()).is_pending());
    }
    store.drain_appends();
    for (n, f) in futs.iter_mut().enumerate() {
        match poll_once(f.as_mut()) {
            Poll::Ready(r) => assert_eq!(r.unwrap().messages[0].queue_offset, (n / 40) as u64),
            Poll::Pending => panic!("put {n} was not appended by the drain"),
        }
    }
    for q in 0..40 {
        let topic = if q % 2 == 0 { "Even" } else { "Odd" };
        assert_eq!(store.max_offset(topic, q), 3);
        let got = store
            .get_messages(topic, q, 0, 32, 1 << 20, &|_| true)
            .unwrap();
        let want: Vec<String> = (0..3).map(|r| format!("q{q}-r{r}")).collect();
        assert_eq!(ids(&got.messages), want, "queue {topic}/{q}");
    }
    // Keys and unique keys went to the index, under each message's own topic.
    let by_key = store
        .query_by_key("Even", "k-q4-r2", 10, i64::MIN, i64::MAX)
        .unwrap();
    assert_eq!(ids(&by_key.concat()), vec!["q4-r2"]);
    let uniq = store.query_by_uniq_key("Odd", "Uq7-r1").unwrap();
    assert_eq!(ids(&uniq.concat()), vec!["q7-r1"]);
    assert!(store
        .query_by_uniq_key("Even", "Uq7-r1")
        .unwrap()
        .is_empty());
    let shared = store
        .query_by_key("Odd", "shared", 100, i64::MIN, i64::MAX)
        .unwrap();
    assert_eq!(shared.len(), 60);
}
