//! What can go wrong, as the application sees it.

use std::fmt;

use tonic::{Code, Status};

/// Why a call gave no answer from Tollgate.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Tollgate could not be asked: no answer within the deadline, `UNAVAILABLE`, or a connection that
    /// failed. Check, peek and acquire return this only when the failure policy is
    /// [`closed`](crate::FailurePolicy::Closed); refund, renew and release always do, as they have
    /// nothing to fail open to.
    Unavailable(Status),
    /// Tollgate answered with an error: a malformed call, an unknown domain, a refund token it does not
    /// accept (`PERMISSION_DENIED`), a lease it does not hold (`NOT_FOUND`). Never subject to the failure
    /// policy: it is a mistake to fix, not an outage to ride out.
    Rejected(Status),
}

impl Error {
    /// Sorts a failed call: an outage or Tollgate's answer.
    pub(crate) fn from_status(status: Status) -> Self {
        // A connection error surfaces as UNAVAILABLE, or as UNKNOWN carrying the transport error when
        // it happens mid-call; CANCELLED is a stream reset by the transport, not by the application.
        let outage = match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => true,
            Code::Unknown => std::error::Error::source(&status).is_some(),
            _ => false,
        };
        if outage {
            Self::Unavailable(status)
        } else {
            Self::Rejected(status)
        }
    }

    /// The gRPC status behind the error.
    pub fn status(&self) -> &Status {
        match self {
            Self::Unavailable(status) | Self::Rejected(status) => status,
        }
    }

    /// Whether Tollgate could not be asked (as opposed to refusing the call).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(status) => write!(f, "Tollgate unavailable: {}", status.message()),
            Self::Rejected(status) => write!(
                f,
                "Tollgate rejected the call ({:?}): {}",
                status.code(),
                status.message()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.status())
    }
}

/// Why [`crate::Client::connect_lazy`] cannot make a client: the address is not a URI, or there is no
/// tokio runtime to run the connection on.
#[derive(Debug)]
pub struct ConnectError {
    address: String,
    reason: String,
}

impl ConnectError {
    pub(crate) fn new(address: &str, reason: impl fmt::Display) -> Self {
        Self {
            address: address.to_owned(),
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot connect to Tollgate at {:?}: {}",
            self.address, self.reason
        )
    }
}

impl std::error::Error for ConnectError {}
