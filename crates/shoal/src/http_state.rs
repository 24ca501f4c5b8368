//! What one HTTP port serves: the process's broker and name server, the name servers the
//! dashboard asks, and who may use the port.

use crate::http_access::{Access, AccessSettings};
use shoal_broker::BrokerApi;
use shoal_namesrv::NamesrvProcessor;
use std::sync::Arc;

/// What one HTTP port serves.
#[derive(Clone, Default)]
pub(crate) struct HttpState {
    /// The broker of this process, if any.
    pub broker: Option<BrokerApi>,
    /// The name server of this process, if any.
    pub namesrv: Option<Arc<NamesrvProcessor>>,
    /// Name servers the dashboard asks for cluster-wide views.
    pub namesrv_addrs: Vec<String>,
    /// Admin client over those name servers (unsigned: for a port without ACL).
    pub admin: Option<Arc<shoal_client::AdminClient>>,
    /// TLS to the name servers, for the admin clients of signed-in sessions.
    pub namesrv_tls: Option<shoal_net::ClientTls>,
    /// Who may use the port.
    pub access: Arc<Access>,
    /// Other registries of the process served at `/metrics` (a controller voter's).
    pub registries: Vec<Arc<shoal_metrics::Metrics>>,
}

impl HttpState {
    /// What a process with this broker and/or name server serves; the dashboard's cluster
    /// views ask `namesrv_addrs`.
    pub(crate) fn new(
        broker: Option<BrokerApi>,
        namesrv: Option<Arc<NamesrvProcessor>>,
        namesrv_addrs: Vec<String>,
    ) -> Self {
        let admin = (!namesrv_addrs.is_empty()).then(|| {
            Arc::new(
                shoal_client::AdminClient::new(namesrv_addrs.clone())
                    .with_timeout(std::time::Duration::from_secs(5)),
            )
        });
        Self {
            broker,
            namesrv,
            namesrv_addrs,
            admin,
            namesrv_tls: None,
            access: Arc::new(Access::new(AccessSettings::default())),
            registries: Vec::new(),
        }
    }

    /// Also serves `registry` at `/metrics`.
    pub(crate) fn with_registry(mut self, registry: Arc<shoal_metrics::Metrics>) -> Self {
        self.registries.push(registry);
        self
    }

    /// Sign-in, sessions and tokens of the port (`[http]` of the broker file).
    pub(crate) fn with_access(mut self, settings: AccessSettings) -> Self {
        self.access = Arc::new(Access::new(settings));
        self
    }

    /// The dashboard's cluster views reach the name servers over TLS.
    pub(crate) fn with_namesrv_tls(mut self, tls: Option<shoal_net::ClientTls>) -> Self {
        self.namesrv_tls = tls.clone();
        if let Some(tls) = tls {
            if !self.namesrv_addrs.is_empty() {
                self.admin = Some(Arc::new(
                    shoal_client::AdminClient::new(self.namesrv_addrs.clone())
                        .with_timeout(std::time::Duration::from_secs(5))
                        .with_tls(tls),
                ));
            }
        }
        self
    }
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState")
            .field("broker", &self.broker.is_some())
            .field("namesrv", &self.namesrv.is_some())
            .field("namesrv_addrs", &self.namesrv_addrs)
            .finish()
    }
}
