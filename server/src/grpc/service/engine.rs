//! `vallum.v1.EngineService`: cores, active revisions, barrier, packet source, and the drift
//! of the kernel tables (`--kernel-tables`, checked on each GetStatus).

use std::sync::Arc;

use tonic::{Request, Response, Status};
use vallum_engine::dataplane::BarrierStrategy;
use vallum_proto::v1 as pb;
use vallum_proto::v1::engine_service_server::EngineService;

use super::State;
use crate::grpc::call;
use crate::grpc::convert;

/// The EngineService implementation.
#[derive(Debug, Clone)]
pub struct EngineApi {
    state: Arc<State>,
}

impl EngineApi {
    /// The service over shared state.
    pub fn new(state: Arc<State>) -> Self {
        EngineApi { state }
    }
}

#[tonic::async_trait]
impl EngineService for EngineApi {
    async fn get_status(
        &self,
        _request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        call::read(&self.state, _request, |_request| async move {
            let engine = self.state.pipeline.engine();
            let gens = engine.generations();
            let packets = engine.core_packets();
            let cores = gens
                .iter()
                .zip(packets.iter().chain(std::iter::repeat(&0)))
                .enumerate()
                .map(|(i, (g, p))| pb::CoreStatus {
                    core: i as u32,
                    generation: *g,
                    packets: *p,
                })
                .collect();
            let active = self
                .state
                .pipeline
                .active()
                .into_iter()
                .map(|(name, a)| pb::ActiveRevision {
                    ruleset: name,
                    revision: a.revision,
                    priority: a.priority,
                })
                .collect();
            let rules = engine
                .rulesets()
                .values()
                .map(|r| r.rule_count() as u64)
                .sum();
            let kernel_tables = match self.state.pipeline.kernel_tables() {
                Some(k) => k
                    .check()
                    .await
                    .into_iter()
                    .map(|d| pb::KernelTableStatus {
                        family: crate::host::kernel_tables::family_name(d.family).into(),
                        table: d.table.name().into(),
                        drift: d.drift,
                        detail: d.detail,
                    })
                    .collect(),
                None => Vec::new(),
            };
            Ok(Response::new(pb::GetStatusResponse {
                cores,
                active,
                barrier_strategy: match engine.barrier() {
                    BarrierStrategy::SeqCst => "seqcst",
                    BarrierStrategy::Membarrier => "membarrier",
                }
                .into(),
                barrier_fallback: engine.barrier_fallback().unwrap_or_default().to_string(),
                packet_source: self.state.source.clone(),
                version: env!("CARGO_PKG_VERSION").into(),
                rules,
                not_loaded: self
                    .state
                    .pipeline
                    .not_loaded()
                    .into_values()
                    .map(|f| pb::NotLoadedRevision {
                        ruleset: f.ruleset,
                        revision: f.revision,
                        error: f.error,
                        time: Some(convert::timestamp(f.at)),
                    })
                    .collect(),
                kernel_tables,
            }))
        })
        .await
    }
}
