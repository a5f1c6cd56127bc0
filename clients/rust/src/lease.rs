//! Concurrency leases: slots of `concurrency` rules held while work runs, given back on drop.
//! [`Client::acquire`] is here, beside what it returns: the client's calls know nothing of leases, and
//! a lease renews and releases through the client's `acquire_raw` and `release_raw`.

use std::time::Duration;

use crate::client::Client;
use crate::decision::duration;
use crate::descriptor::Descriptor;
use crate::error::Error;
use crate::proto::v1;

/// The answer to [`Client::acquire`].
#[derive(Debug)]
#[must_use = "a lease is released as soon as it is dropped"]
// One value per acquire, moved once: boxing the lease would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Acquired {
    /// Every slot was taken (or Tollgate could not be asked and the failure policy is open: see
    /// [`Lease::is_held`]). Keep the lease while the work runs.
    Held(Lease),
    /// A concurrency rule is at its `max_in_flight`; nothing was taken.
    Refused {
        /// The time until the oldest lease on the full rule expires (a release may free a slot
        /// sooner).
        retry_after: Option<Duration>,
    },
}

impl Client {
    /// Takes one in-flight slot of every descriptor's concurrency rule, all or none. The [`Lease`]
    /// holds them until it is released or dropped (released in the background then), or until its
    /// TTL runs out if the process dies first.
    pub async fn acquire(&self, descriptors: &[Descriptor]) -> Result<Acquired, Error> {
        match self.acquire_raw(descriptors, "").await {
            Ok(response) if response.acquired => {
                Ok(Acquired::Held(Lease::new(self.clone(), descriptors, response)))
            }
            Ok(response) => Ok(Acquired::Refused {
                retry_after: duration(response.retry_after),
            }),
            Err(error) => self
                .apply_policy(error)
                .map(|()| Acquired::Held(Lease::failed_open(self.clone()))),
        }
    }
}

/// Slots of concurrency rules, held until [`Lease::release`], or until the lease is dropped (then
/// released in the background, on the current tokio runtime), or until its TTL runs out (a process
/// that died). Renew long work with [`Lease::renew`] before the TTL runs out.
#[derive(Debug)]
#[must_use = "a lease is released as soon as it is dropped"]
pub struct Lease {
    client: Client,
    /// Empty when the lease failed open and holds nothing.
    id: String,
    descriptors: Vec<Descriptor>,
    ttl: Duration,
}

impl Lease {
    pub(crate) fn new(client: Client, descriptors: &[Descriptor], response: v1::AcquireResponse) -> Self {
        Self {
            client,
            id: response.lease_id,
            descriptors: descriptors.to_vec(),
            ttl: duration(response.ttl).unwrap_or_default(),
        }
    }

    /// A lease that holds nothing: Tollgate could not be asked and the failure policy let the work
    /// through.
    pub(crate) fn failed_open(client: Client) -> Self {
        Self {
            client,
            id: String::new(),
            descriptors: Vec::new(),
            ttl: Duration::ZERO,
        }
    }

    /// Whether the lease holds slots; false when it failed open.
    pub fn is_held(&self) -> bool {
        !self.id.is_empty()
    }

    /// The server's id for the lease (`None` when it failed open).
    pub fn id(&self) -> Option<&str> {
        Some(self.id.as_str()).filter(|id| !id.is_empty())
    }

    /// How long the lease lives from its last acquire or renew.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Extends the lease by its rule's TTL from now, taking nothing new; returns the new TTL. A lease
    /// that expired (or was never held anywhere) is [`Error::Rejected`] with `NOT_FOUND`: its slots may
    /// have gone to someone else. A lease that failed open stays as it is.
    pub async fn renew(&mut self) -> Result<Duration, Error> {
        if !self.is_held() {
            return Ok(self.ttl);
        }
        let response = self.client.acquire_raw(&self.descriptors, &self.id).await?;
        self.ttl = duration(response.ttl).unwrap_or_default();
        Ok(self.ttl)
    }

    /// Gives the slots back now and waits for Tollgate to confirm. Returns whether every slot was still
    /// held (false: the lease had expired). A lease that failed open returns true.
    pub async fn release(mut self) -> Result<bool, Error> {
        let id = std::mem::take(&mut self.id);
        if id.is_empty() {
            return Ok(true);
        }
        self.client.release_raw(&id, &self.descriptors).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let id = std::mem::take(&mut self.id);
        if id.is_empty() {
            return;
        }
        // Without a runtime (dropped at shutdown) nothing can be sent: the slots expire after the TTL.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        let descriptors = std::mem::take(&mut self.descriptors);
        runtime.spawn(async move {
            if let Err(error) = client.release_raw(&id, &descriptors).await {
                tracing::warn!(%error, "cannot release a Tollgate lease; its slots expire after its TTL");
            }
        });
    }
}
