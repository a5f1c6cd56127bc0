//! Generated protocol types, nested by proto package so generated cross-references resolve.
//!
//! The `.proto` sources are in `proto/`; `build.rs` compiles them with protox. Reflection serves
//! [`FILE_DESCRIPTOR_SET`].

#![allow(missing_docs, unreachable_pub, clippy::all)]

/// Encoded `FileDescriptorSet` of every compiled proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));

/// `envoy.*` packages.
pub mod envoy {
    /// `envoy.service.*`
    pub mod service {
        /// `envoy.service.discovery.*`
        pub mod discovery {
            /// `envoy.service.discovery.v3`: Aggregated Discovery (State of the World), for the xDS
            /// client.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.discovery.v3.rs"));
            }
        }
        /// `envoy.service.ratelimit.*`
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`: the RateLimitService and its messages.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
            }
        }
    }
    /// `envoy.extensions.*`
    pub mod extensions {
        /// `envoy.extensions.common.*`
        pub mod common {
            /// `envoy.extensions.common.ratelimit.*`
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`: descriptors.
                pub mod v3 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/envoy.extensions.common.ratelimit.v3.rs"
                    ));
                }
            }
        }
    }
    /// `envoy.type.*`
    pub mod r#type {
        /// `envoy.type.v3`: units.
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
    /// `envoy.config.*`
    pub mod config {
        /// `envoy.config.core.*`
        pub mod core {
            /// `envoy.config.core.v3`: HeaderValue, Node.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/envoy.config.core.v3.rs"));
            }
        }
    }
}

/// `google.*` packages.
pub mod google {
    /// `google.rpc`: the error model an xDS NACK carries.
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
    }
}

/// `ratelimit.*` packages: envoyproxy/ratelimit's own.
pub mod ratelimit {
    /// `ratelimit.config.*`
    pub mod config {
        /// `ratelimit.config.ratelimit.*`
        pub mod ratelimit {
            /// `ratelimit.config.ratelimit.v3`: `RateLimitConfig`, one domain's rules as an xDS resource.
            pub mod v3 {
                include!(concat!(env!("OUT_DIR"), "/ratelimit.config.ratelimit.v3.rs"));
            }
        }
    }
}

/// `tollgate.*` packages.
pub mod tollgate {
    /// `tollgate.v1`: the native API for application servers (Check, Refund, Acquire, Release).
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/tollgate.v1.rs"));
    }
}

pub use envoy::extensions::common::ratelimit::v3 as descriptor;
pub use envoy::service::discovery::v3 as xds;
pub use envoy::service::ratelimit::v3 as rls;
pub use ratelimit::config::ratelimit::v3 as rls_config;
pub use tollgate::v1 as native;

impl native::Descriptor {
    /// A descriptor of these `(key, value)` entries, in order, at the request's cost.
    pub fn from_entries<K: Into<String>, V: Into<String>>(entries: impl IntoIterator<Item = (K, V)>) -> Self {
        let entries = entries
            .into_iter()
            .map(|(key, value)| native::Entry {
                key: key.into(),
                value: value.into(),
            })
            .collect();
        Self { entries, cost: None }
    }
}

impl descriptor::RateLimitDescriptor {
    /// A descriptor of these `(key, value)` entries, in order, with no limit override and no
    /// descriptor-level hits.
    pub fn from_entries<K: Into<String>, V: Into<String>>(entries: impl IntoIterator<Item = (K, V)>) -> Self {
        let entries = entries
            .into_iter()
            .map(|(key, value)| descriptor::rate_limit_descriptor::Entry {
                key: key.into(),
                value: value.into(),
            })
            .collect();
        Self {
            entries,
            ..Default::default()
        }
    }
}
