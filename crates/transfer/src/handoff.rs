//! A bounded queue between a file thread that blocks and an async task that
//! must not: either end can wait blocking (`blocking_send`, `blocking_recv`)
//! or as a future (`send`, `recv`), so the crate needs no async runtime.
//! One sender, one receiver; dropping either end closes the queue, which the
//! other end sees once what is queued is taken (a receiver) or at once (a
//! sender).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A queue of at most `capacity` items (at least 1).
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    assert!(capacity > 0, "a handoff queue holds at least one item");
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            capacity,
            sender_gone: false,
            receiver_gone: false,
            sender_waker: None,
            receiver_waker: None,
        }),
        changed: Condvar::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Signalled on every change, for an end waiting blocking.
    changed: Condvar,
}

struct State<T> {
    queue: VecDeque<T>,
    capacity: usize,
    sender_gone: bool,
    receiver_gone: bool,
    /// An end waiting as a future, woken on the next change.
    sender_waker: Option<Waker>,
    receiver_waker: Option<Waker>,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock leaves the queue consistent (every
        // change is one push or pop), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells both ends that something changed.
    fn notify(&self, mut state: MutexGuard<'_, State<T>>) {
        let wakers = [state.sender_waker.take(), state.receiver_waker.take()];
        drop(state);
        self.changed.notify_all();
        wakers.into_iter().flatten().for_each(Waker::wake);
    }
}

/// The receiving end is gone; the item that could not be sent is returned.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed<T>(pub T);

/// Why [`Receiver::try_recv`] returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing queued yet.
    Empty,
    /// Nothing queued and the sender is gone.
    Disconnected,
}

/// The sending end.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `item` once there is room, waiting blocking.
    pub fn blocking_send(&mut self, item: T) -> Result<(), Closed<T>> {
        let mut state = self.shared.lock();
        loop {
            if state.receiver_gone {
                return Err(Closed(item));
            }
            if state.queue.len() < state.capacity {
                state.queue.push_back(item);
                self.shared.notify(state);
                return Ok(());
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Queues `item` once there is room.
    pub fn send(&mut self, item: T) -> Send<'_, T> {
        Send {
            sender: self,
            item: Some(item),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.sender_gone = true;
        self.shared.notify(state);
    }
}

/// The future of [`Sender::send`].
pub struct Send<'a, T> {
    sender: &'a mut Sender<T>,
    item: Option<T>,
}

impl<T> Unpin for Send<'_, T> {}

impl<T> Future for Send<'_, T> {
    type Output = Result<(), Closed<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let item = this.item.take().expect("polled after completion");
        let shared = &this.sender.shared;
        let mut state = shared.lock();
        if state.receiver_gone {
            return Poll::Ready(Err(Closed(item)));
        }
        if state.queue.len() < state.capacity {
            state.queue.push_back(item);
            shared.notify(state);
            return Poll::Ready(Ok(()));
        }
        state.sender_waker = Some(cx.waker().clone());
        this.item = Some(item);
        Poll::Pending
    }
}

/// The receiving end.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// The next item, waiting blocking; `None` once the sender is gone and
    /// everything it sent was taken.
    pub fn blocking_recv(&mut self) -> Option<T> {
        let mut state = self.shared.lock();
        loop {
            if let Some(item) = state.queue.pop_front() {
                self.shared.notify(state);
                return Some(item);
            }
            if state.sender_gone {
                return None;
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The next item if one is queued.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut state = self.shared.lock();
        match state.queue.pop_front() {
            Some(item) => {
                self.shared.notify(state);
                Ok(item)
            }
            None if state.sender_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// The next item; `None` once the sender is gone and everything it sent
    /// was taken.
    pub fn recv(&mut self) -> Recv<'_, T> {
        Recv { receiver: self }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.receiver_gone = true;
        // Nobody will take them; free them now rather than with the sender.
        let dropped = std::mem::take(&mut state.queue);
        self.shared.notify(state);
        drop(dropped);
    }
}

/// The future of [`Receiver::recv`].
pub struct Recv<'a, T> {
    receiver: &'a mut Receiver<T>,
}

impl<T> Future for Recv<'_, T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = &self.receiver.shared;
        let mut state = shared.lock();
        if let Some(item) = state.queue.pop_front() {
            shared.notify(state);
            return Poll::Ready(Some(item));
        }
        if state.sender_gone {
            return Poll::Ready(None);
        }
        state.receiver_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::thread;
    use std::time::Duration;

    /// Counts its wakes.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    #[test]
    fn blocking_ends_keep_order_and_bound() {
        let (mut tx, mut rx) = channel(2);
        let producer = thread::spawn(move || {
            for i in 0..1000 {
                tx.blocking_send(i).unwrap();
            }
        });
        let received: Vec<i32> = std::iter::from_fn(|| rx.blocking_recv()).collect();
        producer.join().unwrap();
        assert_eq!(received, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn try_recv_tells_empty_from_disconnected() {
        let (mut tx, mut rx) = channel(1);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.blocking_send(7).unwrap();
        drop(tx);
        // What was sent is still taken after the sender went away.
        assert_eq!(rx.try_recv(), Ok(7));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(rx.blocking_recv(), None);
    }

    #[test]
    fn a_dropped_receiver_fails_blocked_and_later_sends() {
        let (mut tx, rx) = channel(1);
        tx.blocking_send(1).unwrap();
        let producer = thread::spawn(move || tx.blocking_send(2));
        thread::sleep(Duration::from_millis(20));
        drop(rx);
        assert_eq!(producer.join().unwrap(), Err(Closed(2)));
    }

    #[test]
    fn an_async_sender_waits_for_room_and_is_woken() {
        let (mut tx, mut rx) = channel(1);
        let (wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut first = tx.send(1);
        assert_eq!(Pin::new(&mut first).poll(&mut cx), Poll::Ready(Ok(())));
        let mut second = tx.send(2);
        assert_eq!(Pin::new(&mut second).poll(&mut cx), Poll::Pending);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        assert_eq!(rx.blocking_recv(), Some(1));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert_eq!(Pin::new(&mut second).poll(&mut cx), Poll::Ready(Ok(())));
        drop(rx);
        let mut third = tx.send(3);
        assert_eq!(
            Pin::new(&mut third).poll(&mut cx),
            Poll::Ready(Err(Closed(3)))
        );
    }

    #[test]
    fn an_async_receiver_is_woken_by_a_send_and_by_the_end() {
        let (mut tx, mut rx) = channel(4);
        let (wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        {
            let mut next = rx.recv();
            assert_eq!(Pin::new(&mut next).poll(&mut cx), Poll::Pending);
            tx.blocking_send("a").unwrap();
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
            assert_eq!(Pin::new(&mut next).poll(&mut cx), Poll::Ready(Some("a")));
        }
        let mut next = rx.recv();
        assert_eq!(Pin::new(&mut next).poll(&mut cx), Poll::Pending);
        drop(tx);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert_eq!(Pin::new(&mut next).poll(&mut cx), Poll::Ready(None));
    }
}
