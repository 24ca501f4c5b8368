//! The broker's side of the name servers: registration and unregistration, and the other
//! brokers' queues of a topic (the coordinator allocates every queue of the cluster), cached
//! and watched: a Shoal name server pushes changes of those routes (NOTIFY_ROUTE_CHANGED),
//! which `route_notices.rs` turns into fresh queues for the coordinator.

use parking_lot::Mutex;
use shoal_net::{processor_fn, request_code_not_supported, NetConfig, RemotingClient};
use shoal_proto::acl::SessionCredentials;
use shoal_proto::body::{ClusterInfo, TopicRouteData};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::{kafka_cluster, route_watch};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::warn;

/// How long another broker's queues of a topic are taken from the cache.
const ROUTE_CACHE_TTL: Duration = Duration::from_secs(2);

/// Name server requests time out after this long.
const NAMESRV_TIMEOUT: Duration = Duration::from_secs(3);

/// The name servers as this broker uses them. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct NameServers {
    client: RemotingClient,
    addrs: Vec<String>,
    credentials: Option<SessionCredentials>,
    broker_name: String,
    /// A topic's route (every broker, with their Kafka listeners) and when it was fetched.
    route_cache: Mutex<HashMap<String, (Arc<TopicRouteData>, Instant)>>,
    /// The cluster's broker groups (with their Kafka listeners), as last fetched.
    cluster_cache: Mutex<Option<Arc<ClusterInfo>>>,
    /// When the cluster's broker groups were last fetched or tried.
    cluster_tried: Mutex<Option<Instant>>,
    /// Topics whose route a name server said changed, not yet fetched again.
    notices: Arc<RouteNotices>,
}

/// Topics named by NOTIFY_ROUTE_CHANGED, waiting for the broker's route task.
#[derive(Debug, Default)]
struct RouteNotices {
    topics: Mutex<BTreeSet<String>>,
    wake: Notify,
}

/// Topics waiting at most (the broker watches only the topics its coordinator asked about;
/// more than this from a name server is not believed, and the cache's expiry still holds).
const MAX_PENDING_NOTICES: usize = 4096;

impl NameServers {
    pub(crate) fn new(
        addrs: Vec<String>,
        credentials: Option<SessionCredentials>,
        broker_name: String,
        tls: Option<shoal_net::ClientTls>,
    ) -> Self {
        let notices = Arc::new(RouteNotices::default());
        let heard = Arc::clone(&notices);
        // The name servers' requests on these connections: route notices only.
        let processor = processor_fn(move |_ctx, req: RemotingCommand| {
            let heard = Arc::clone(&heard);
            async move {
                if req.code != route_watch::request_code::NOTIFY_ROUTE_CHANGED {
                    return Ok(Some(request_code_not_supported(&req)));
                }
                let n: route_watch::RouteChangedNotice = req.decode_json_body()?;
                {
                    let mut topics = heard.topics.lock();
                    for t in n.topics {
                        if topics.len() >= MAX_PENDING_NOTICES {
                            break;
                        }
                        topics.insert(t);
                    }
                }
                heard.wake.notify_one();
                Ok(None)
            }
        });
        Self {
            client: RemotingClient::with_tls(NetConfig::default(), Arc::new(processor), tls),
            addrs,
            credentials,
            broker_name,
            route_cache: Mutex::new(HashMap::new()),
            cluster_cache: Mutex::new(None),
            cluster_tried: Mutex::new(None),
            notices,
        }
    }

    /// Waits for route notices; returns the topics they named whose other brokers' queues
    /// this broker keeps (the others are not its business).
    pub(crate) async fn changed_topics(&self) -> Vec<String> {
        loop {
            let taken = std::mem::take(&mut *self.notices.topics.lock());
            let kept: Vec<String> = {
                let cache = self.route_cache.lock();
                taken
                    .into_iter()
                    .filter(|t| cache.contains_key(t))
                    .collect()
            };
            if !kept.is_empty() {
                return kept;
            }
            self.notices.wake.notified().await;
        }
    }

    /// Fetches the other brokers' queues of `topic` again (the cache aside); true when they
    /// differ from those cached.
    pub(crate) async fn refresh_other_queues(&self, topic: &str) -> bool {
        let Some(fresh) = self.fetch_route(topic).await else {
            return false;
        };
        let mut cache = self.route_cache.lock();
        let changed = cache
            .get(topic)
            .is_none_or(|(r, _)| self.others(topic, r) != self.others(topic, &fresh));
        cache.insert(topic.to_string(), (fresh, Instant::now()));
        changed
    }

    /// The other brokers' readable queues in a route.
    fn others(&self, topic: &str, route: &TopicRouteData) -> Vec<MessageQueue> {
        route
            .subscribe_queues(topic)
            .into_iter()
            .filter(|q| q.broker_name != self.broker_name)
            .collect()
    }

    /// A topic's route as last fetched (no request), with the brokers' Kafka listeners.
    pub(crate) fn known_route(&self, topic: &str) -> Option<Arc<TopicRouteData>> {
        self.route_cache.lock().get(topic).map(|(r, _)| r.clone())
    }

    /// Fetches `topic`'s route unless the cached one was fetched (or tried) less than
    /// `max_age` ago. The cached one stays when no name server answers, and it is not tried
    /// again before `max_age` (a name server that does not answer delays one request a
    /// period, not every one). A topic no broker serves is not cached.
    pub(crate) async fn refresh_route(&self, topic: &str, max_age: Duration) {
        {
            let mut cache = self.route_cache.lock();
            if let Some((_, at)) = cache.get_mut(topic) {
                if at.elapsed() < max_age {
                    return;
                }
                // Tried now: concurrent callers use the cached route meanwhile.
                *at = Instant::now();
            }
        }
        match self.fetch_route(topic).await {
            Some(r) if r.queue_datas.is_empty() => {
                self.route_cache.lock().remove(topic);
            }
            Some(r) => {
                self.route_cache
                    .lock()
                    .insert(topic.to_string(), (r, Instant::now()));
            }
            None => {}
        }
    }

    /// The cluster's broker groups as last fetched (no request).
    pub(crate) fn known_cluster(&self) -> Option<Arc<ClusterInfo>> {
        self.cluster_cache.lock().clone()
    }

    /// Fetches the cluster's broker groups (with their Kafka listeners) unless they were
    /// fetched or tried less than `max_age` ago (the cached ones stay when no name server
    /// answers).
    pub(crate) async fn refresh_cluster(&self, max_age: Duration) {
        {
            let mut tried = self.cluster_tried.lock();
            if tried.is_some_and(|at| at.elapsed() < max_age) {
                return;
            }
            *tried = Some(Instant::now());
        }
        let mut req = RemotingCommand::request(rc::GET_BROKER_CLUSTER_INFO);
        kafka_cluster::want_listeners(&mut req);
        for addr in &self.addrs {
            match self.client.invoke(addr, req.clone(), NAMESRV_TIMEOUT).await {
                Ok(r) if r.code == resp::SUCCESS => {
                    if let Ok(c) = r.decode_json_body::<ClusterInfo>() {
                        *self.cluster_cache.lock() = Some(Arc::new(c));
                    }
                    return;
                }
                Ok(_) | Err(_) => continue,
            }
        }
    }

    /// Calls another broker (`addr`), signed like requests to the name servers.
    pub(crate) async fn call_broker(
        &self,
        addr: &str,
        mut req: RemotingCommand,
    ) -> Result<RemotingCommand, String> {
        if let Some(c) = &self.credentials {
            shoal_proto::acl::sign_request(&mut req, c);
        }
        self.client
            .invoke(addr, req, NAMESRV_TIMEOUT)
            .await
            .map_err(|e| format!("broker {addr}: {e}"))
    }

    /// How many name servers there are.
    pub(crate) fn count(&self) -> usize {
        self.addrs.len()
    }

    /// Sends `req` (signed when credentials are set) to every name server in parallel;
    /// returns how many answered SUCCESS.
    pub(crate) async fn to_all(&self, mut req: RemotingCommand, what: &'static str) -> usize {
        if let Some(c) = &self.credentials {
            shoal_proto::acl::sign_request(&mut req, c);
        }
        let futs = self.addrs.iter().map(|addr| {
            let req = req.clone();
            async move {
                match self.client.invoke(addr, req, NAMESRV_TIMEOUT).await {
                    Ok(r) if r.code == resp::SUCCESS => true,
                    Ok(r) => {
                        warn!(namesrv = %addr, code = r.code, remark = ?r.remark, "name server refused the {what}");
                        false
                    }
                    Err(e) => {
                        warn!(namesrv = %addr, error = %e, "{what} with a name server failed");
                        false
                    }
                }
            }
        });
        futures::future::join_all(futs)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// Other brokers' readable queues of `topic`, from the cache when fresh, else from the
    /// first name server that answers (the last known when none does).
    pub(crate) async fn other_queues(&self, topic: &str) -> Vec<MessageQueue> {
        let fresh = self
            .route_cache
            .lock()
            .get(topic)
            .filter(|(_, at)| at.elapsed() < ROUTE_CACHE_TTL)
            .map(|(r, _)| r.clone());
        if let Some(r) = fresh {
            return self.others(topic, &r);
        }
        match self.fetch_route(topic).await {
            Some(r) => {
                let o = self.others(topic, &r);
                self.route_cache
                    .lock()
                    .insert(topic.to_string(), (r, Instant::now()));
                o
            }
            None => self.known_other_queues(topic),
        }
    }

    /// Other brokers' queues of `topic` as last fetched (no request).
    pub(crate) fn known_other_queues(&self, topic: &str) -> Vec<MessageQueue> {
        let route = self.known_route(topic);
        route.map(|r| self.others(topic, &r)).unwrap_or_default()
    }

    /// The topic's route from the first name server that answers (an empty route when it
    /// does not know the topic; none when no name server answers).
    async fn fetch_route(&self, topic: &str) -> Option<Arc<TopicRouteData>> {
        let mut req = RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &shoal_proto::header::GetRouteInfoRequestHeader {
                topic: topic.to_string(),
                ..Default::default()
            },
        );
        // Changes are pushed from now on (a Shoal name server; the cache's expiry otherwise).
        route_watch::watch(&mut req);
        kafka_cluster::want_listeners(&mut req);
        for addr in &self.addrs {
            match self.client.invoke(addr, req.clone(), NAMESRV_TIMEOUT).await {
                Ok(r) if r.code == resp::SUCCESS => {
                    return r.decode_json_body::<TopicRouteData>().ok().map(Arc::new);
                }
                Ok(_) => return Some(Arc::new(TopicRouteData::default())),
                Err(_) => continue,
            }
        }
        None
    }

    /// Closes the connections to the name servers.
    pub(crate) fn shutdown(&self) {
        self.client.shutdown();
    }
}
