//! A drained group of queued requests, and how each gets its answer: the requests the coalescer
//! ([`super::coalesce`]) queues, and their decisions handed back in request order, each request
//! answered as soon as its own items are decided. The ways to Redis that carry a group
//! ([`super::pipeline`], [`super::cluster_scripts`]) write into it.

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::script::ScriptItem;
use crate::algorithm::Decision;
use crate::store::StoreError;

/// Where a queued request's answer goes: its decisions, or the error that stopped them.
pub(super) type Reply = oneshot::Sender<Result<Vec<Decision>, StoreError>>;

/// One queued request: its items with their Redis keys, and where its decisions go.
pub(super) struct Pending {
    /// Each item's key and the item (whose `key` field points at it when the call is made).
    pub(super) named: Vec<(String, ScriptItem<'static>)>,
    /// The request's answer.
    pub(super) reply: Reply,
    /// When the caller stops waiting: past it, the request is never sent.
    pub(super) deadline: Instant,
    /// Every item is a fixed-window counter `INCRBY` decides ([`super::pipeline`]).
    pub(super) pipelined: bool,
    /// When it was queued: the gathering window runs from the first request of a call.
    pub(super) queued_at: Instant,
}

impl Pending {
    /// Whether nobody waits for this request's answer any more.
    pub(super) fn abandoned(&self) -> bool {
        self.reply.is_closed() || Instant::now() >= self.deadline
    }
}

/// The requests of a group, each answered as soon as all its items are decided: a master that is slow
/// or gone, or a call made again elsewhere, holds up only the requests whose items it carries. The calls
/// write the items' decisions in place ([`Answers::decisions`]) and then record them.
pub(super) struct Answers {
    /// Per request: where to send its answer (taken when sent).
    replies: Vec<Option<Reply>>,
    /// Per request: its first item (items come in request order), then one past the last item.
    bounds: Vec<usize>,
    /// Per request: how many of its items are still undecided.
    undecided: Vec<usize>,
    /// Per item: its request.
    request_of: Vec<usize>,
    /// Per item: its decision, or the error of the call that should have made it; read once recorded.
    decisions: Vec<Result<Decision, StoreError>>,
    /// Per item: whether its decision is recorded (so that recording it again counts nothing).
    recorded: Vec<bool>,
}

impl Answers {
    /// The requests of `group` to answer, and each one's items (in request order), which the calls borrow.
    pub(super) fn new(group: Vec<Pending>) -> (Vec<Vec<(String, ScriptItem<'static>)>>, Self) {
        let items = group.iter().map(|p| p.named.len()).sum();
        let mut answers = Self {
            replies: Vec::with_capacity(group.len()),
            bounds: Vec::with_capacity(group.len() + 1),
            undecided: Vec::with_capacity(group.len()),
            request_of: Vec::with_capacity(items),
            decisions: vec![Ok(Decision::default()); items],
            recorded: vec![false; items],
        };
        let mut named = Vec::with_capacity(group.len());
        answers.bounds.push(0);
        for (request, pending) in group.into_iter().enumerate() {
            answers
                .request_of
                .extend(std::iter::repeat_n(request, pending.named.len()));
            answers.bounds.push(answers.request_of.len());
            answers.undecided.push(pending.named.len());
            answers.replies.push(Some(pending.reply));
            named.push(pending.named);
        }
        // A request without items (none is queued so) has nothing to wait for.
        for request in 0..answers.replies.len() {
            answers.answer_if_decided(request);
        }
        (named, answers)
    }

    /// The items' decisions, indexed like the group's items, for the calls to write before they
    /// [`Answers::record`] them.
    pub(super) fn decisions(&mut self) -> &mut [Result<Decision, StoreError>] {
        &mut self.decisions
    }

    /// Records that the items at `positions` are decided (their decisions written), and answers every
    /// request whose items are now all decided. Recording an item again counts nothing.
    pub(super) fn record(&mut self, positions: impl IntoIterator<Item = usize>) {
        for at in positions {
            if std::mem::replace(&mut self.recorded[at], true) {
                continue;
            }
            let request = self.request_of[at];
            self.undecided[request] -= 1;
            self.answer_if_decided(request);
        }
    }

    /// Sends `request` its decisions, or the error of the first of its items that has one, once all are
    /// decided.
    fn answer_if_decided(&mut self, request: usize) {
        if self.undecided[request] > 0 {
            return;
        }
        let Some(reply) = self.replies[request].take() else {
            return;
        };
        let own = self.decisions[self.bounds[request]..self.bounds[request + 1]]
            .iter()
            .cloned()
            .collect();
        let _ = reply.send(own);
    }
}

/// Hands each request of a group its own decisions (they come in request order), or the call's error.
pub(super) fn answer(group: Vec<Pending>, result: Result<Vec<Decision>, StoreError>) {
    match result {
        Ok(decisions) => {
            let mut decisions = decisions.into_iter();
            for request in group {
                let own = decisions.by_ref().take(request.named.len()).collect();
                let _ = request.reply.send(Ok(own));
            }
        }
        Err(error) => {
            for request in group {
                let _ = request.reply.send(Err(error.clone()));
            }
        }
    }
}

/// Puts a script call's decisions for the items at `positions` in their places, or its error.
pub(super) fn place(
    decisions: &mut [Result<Decision, StoreError>],
    positions: &[usize],
    result: Result<Vec<Decision>, StoreError>,
) {
    match result {
        Ok(decided) => {
            for (&at, decision) in positions.iter().zip(decided) {
                decisions[at] = Ok(decision);
            }
        }
        Err(error) => fail(decisions, positions.iter().copied(), &error),
    }
}

/// Gives the items at `positions` the error of the pipeline or call that should have decided them.
pub(super) fn fail(
    decisions: &mut [Result<Decision, StoreError>],
    positions: impl Iterator<Item = usize>,
    error: &StoreError,
) {
    for at in positions {
        decisions[at] = Err(error.clone());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{Algorithm, Limit};

    /// A queued request of `items` items, and where its answer arrives.
    fn request(items: usize) -> (Pending, oneshot::Receiver<Result<Vec<Decision>, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let item = ScriptItem {
            key: "",
            limit: Limit {
                algorithm: Algorithm::FixedWindow,
                requests: 10,
                window_us: 1_000_000,
                burst: 10,
            },
            cost: 1,
            group: 0,
            window_start_us: 0,
            ttl_secs: 1,
        };
        let pending = Pending {
            named: vec![(String::new(), item); items],
            reply,
            deadline: Instant::now() + Duration::from_secs(1),
            pipelined: true,
            queued_at: Instant::now(),
        };
        (pending, answer)
    }

    fn allowed(remaining: u64) -> Result<Decision, StoreError> {
        Ok(Decision {
            allowed: true,
            remaining,
            ..Decision::default()
        })
    }

    #[test]
    fn each_request_is_answered_once_its_own_items_are_decided() {
        // Three requests of 2, 1 and 2 items: items 0-1, 2, 3-4.
        let (first, mut first_answer) = request(2);
        let (second, mut second_answer) = request(1);
        let (third, mut third_answer) = request(2);
        let (named, mut answers) = Answers::new(vec![first, second, third]);
        assert_eq!(named.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 2]);
        let gone = StoreError::Unavailable("master gone".into());
        let decided = [allowed(4), allowed(3), allowed(2), Err(gone.clone()), allowed(0)];
        let write = |answers: &mut Answers, positions: &[usize]| {
            for &at in positions {
                answers.decisions()[at] = decided[at].clone();
            }
        };

        // The second request's item and one of the first's: only the second is complete.
        write(&mut answers, &[2, 0]);
        answers.record([2, 0]);
        assert_eq!(
            second_answer.try_recv().expect("answered"),
            Ok(vec![decided[2].clone().unwrap()])
        );
        assert!(first_answer.try_recv().is_err(), "still waits for item 1");
        assert!(third_answer.try_recv().is_err());

        // The third request's items, one failed: its error, while the first still waits.
        write(&mut answers, &[4, 3]);
        answers.record([4, 3]);
        assert_eq!(third_answer.try_recv().expect("answered"), Err(gone));
        assert!(first_answer.try_recv().is_err());

        // Item 0 recorded again counts nothing: the first request still waits for item 1.
        answers.record([0]);
        assert!(
            first_answer.try_recv().is_err(),
            "an item recorded twice counted twice"
        );
        write(&mut answers, &[1]);
        answers.record([1]);
        assert_eq!(
            first_answer.try_recv().expect("answered"),
            Ok(vec![decided[0].clone().unwrap(), decided[1].clone().unwrap()])
        );
    }
}
