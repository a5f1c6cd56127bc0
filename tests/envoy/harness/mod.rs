//! What every Envoy test runs: Envoy ([`envoy`]) from a bootstrap ([`bootstrap`]), `tollgate serve`
//! ([`tollgate`]), and a downstream client ([`client`]).

pub mod bootstrap;
pub mod client;
pub mod envoy;
pub mod tollgate;

use serde_json::Value;

use bootstrap::{bootstrap, tollgate_cluster};
use client::Client;
use envoy::Envoy;
use tollgate::Tollgate;

/// An Envoy in front of `tollgate`, and a client of its `ingress` listener: `filters` (the router
/// appended), `routes`, the upstream `app` (answering `upstream`), and Tollgate's cluster with
/// `cluster` settings over the defaults.
pub async fn envoy_in_front(
    tollgate: &Tollgate,
    filters: Vec<Value>,
    routes: Vec<Value>,
    cluster: Value,
) -> (Envoy, Client) {
    let envoy = Envoy::start(&bootstrap(
        filters,
        routes,
        &[("app", "upstream\n")],
        vec![tollgate_cluster(&[tollgate.grpc()], cluster)],
    ))
    .await;
    let client = Client::new(envoy.listener("ingress").await);
    (envoy, client)
}
