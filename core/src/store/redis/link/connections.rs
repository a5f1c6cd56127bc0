//! The live connections of a link: to one node (a single Redis, or the master Sentinel names), or to
//! a Redis Cluster; and the connection a call sent whole runs on.

use std::future::Future;
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;

use super::error::CallError;
use super::node_pool::NodePool;

/// Live connections, filled in by the background connector.
pub(crate) enum Connections {
    /// A single Redis or Sentinel's master.
    Node(Arc<NodePool>),
    Cluster(ClusterConnection),
}

impl Connections {
    /// Runs `call` on a connection for a call sent whole: on one node the next of the pool that is
    /// not stalled, whose pool then learns how the call went (a timeout stalls the connection); in a
    /// cluster the cluster connection, which routes by the call's keys.
    pub(crate) async fn on_whole<T, Fut>(
        &self,
        call: impl FnOnce(WholeConnection) -> Fut,
    ) -> Result<T, CallError>
    where
        Fut: Future<Output = Result<T, CallError>>,
    {
        match self {
            Connections::Node(pool) => {
                let taken = pool.take().ok_or(CallError::Stalled)?;
                let result = call(WholeConnection::Node(taken.conn)).await;
                pool.after_call(taken.entry, &result);
                result
            }
            Connections::Cluster(conn) => call(WholeConnection::Cluster(conn.clone())).await,
        }
    }

    /// A connection for the first calls (to load what the link's user needs before requests come): the
    /// pool's first, stalled or not, or the cluster connection.
    pub(super) fn first(&self) -> WholeConnection {
        match self {
            Connections::Node(pool) => WholeConnection::Node(pool.first()),
            Connections::Cluster(conn) => WholeConnection::Cluster(conn.clone()),
        }
    }
}

/// A connection for calls sent whole: to the single node or Sentinel's master, or to the cluster
/// (which routes by the call's keys).
#[derive(Clone)]
pub(crate) enum WholeConnection {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for WholeConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            WholeConnection::Node(conn) => conn.req_packed_command(cmd),
            WholeConnection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            WholeConnection::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            WholeConnection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            WholeConnection::Node(conn) => conn.get_db(),
            WholeConnection::Cluster(conn) => conn.get_db(),
        }
    }
}
