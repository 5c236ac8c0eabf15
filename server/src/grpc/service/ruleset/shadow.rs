//! RulesetService's ShadowRevision, EndShadow and GetShadowReport: the request checks (field
//! paths) and the answers; the work is the pipeline's ([`crate::control::pipeline::shadow`]).

use vallum_engine::engine::{DEFAULT_SHADOW_FLOWS, MAX_SHADOW_FLOWS, ShadowConfig};
use vallum_proto::v1 as pb;

use super::RulesetApi;
use crate::control::pipeline::shadow::MAX_SHADOW;
use crate::error::{Error, Result};
use crate::grpc::convert;

/// ShadowRevision: checks `name`, `duration` (above 0, at most [`MAX_SHADOW`]) and
/// `max_flows` (at most [`MAX_SHADOW_FLOWS`]), then starts the shadow.
///
/// Errors: INVALID_ARGUMENT at those fields; the pipeline's ([`crate::control::pipeline::Pipeline::shadow`]).
pub async fn shadow_revision(
    api: &RulesetApi,
    r: &pb::ShadowRevisionRequest,
) -> Result<pb::ShadowReport> {
    let (ruleset, number) = convert::revision_name("name", &r.name)?;
    let duration = convert::duration("duration", r.duration.as_ref())?
        .ok_or_else(|| Error::invalid("duration", "required: how long the shadow runs"))?;
    if duration > MAX_SHADOW {
        return Err(Error::invalid(
            "duration",
            format!("at most {} h", MAX_SHADOW.as_secs() / 3600),
        ));
    }
    let max_flows = match r.max_flows as usize {
        0 => DEFAULT_SHADOW_FLOWS,
        n if n > MAX_SHADOW_FLOWS => {
            return Err(Error::invalid(
                "max_flows",
                format!("at most {MAX_SHADOW_FLOWS}"),
            ));
        }
        n => n,
    };
    let config = ShadowConfig {
        max_flows,
        sample: r.sample_one_in.max(1),
    };
    let pipeline = &api.state.pipeline;
    let (report, deadline) = pipeline.shadow(&ruleset, number, duration, config).await?;
    Ok(convert::shadow_report(
        &report,
        Some(deadline.ends),
        pipeline.clock(),
    ))
}

/// EndShadow.
///
/// Errors: INVALID_ARGUMENT at `ruleset`; NOT_FOUND when no shadow of it runs.
pub async fn end_shadow(api: &RulesetApi, r: &pb::EndShadowRequest) -> Result<pb::ShadowReport> {
    let ruleset = convert::ruleset_id("ruleset", &r.ruleset)?;
    let pipeline = &api.state.pipeline;
    let report = pipeline.end_shadow(&ruleset).await?;
    Ok(convert::shadow_report(&report, None, pipeline.clock()))
}

/// GetShadowReport.
///
/// Errors: INVALID_ARGUMENT at `ruleset`; NOT_FOUND when it had no shadow.
pub fn get_shadow_report(
    api: &RulesetApi,
    r: &pb::GetShadowReportRequest,
) -> Result<pb::ShadowReport> {
    let ruleset = convert::ruleset_id("ruleset", &r.ruleset)?;
    let pipeline = &api.state.pipeline;
    let (report, deadline) = pipeline.shadow_report(&ruleset)?;
    Ok(convert::shadow_report(
        &report,
        deadline.map(|d| d.ends),
        pipeline.clock(),
    ))
}
