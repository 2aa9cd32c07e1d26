//! `archplace explain RESULT_DIR`: why the winner of a finished search wins — the chips it
//! beat and what limits each, what the near-ties differ in, the winner's one-axis
//! sensitivities — read from the folder's `result.json` and `explored.jsonl`.

use super::{Exit, print_json};
use anyhow::Result;
use archplace_job::{chip, explain, folder};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// A search's result folder (with `result.json` and `explored.jsonl`).
    pub dir: PathBuf,
    /// Print the explanation as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ExplainArgs) -> Result<Exit> {
    let (doc, explored) = folder::read_results(&args.dir)?;
    let explained = doc
        .best
        .as_ref()
        .and_then(|b| explain::explain(b, doc.spec.network.as_ref(), &explored));
    let Some(e) = explained else {
        outln!(
            "search `{}`: no chip trained every model; nothing to explain (see {})",
            doc.spec.name,
            args.dir.join(folder::EXPLORED).display()
        )?;
        return Ok(Exit::Infeasible);
    };
    if args.json {
        print_json(&e)?;
        return Ok(Exit::Success);
    }
    if let Some(best) = &doc.best {
        outln!(
            "search `{}`: {} candidates evaluated; the winner: {}",
            doc.spec.name,
            doc.search.candidates_evaluated,
            chip::long(&best.configuration, best.hbm_bytes)
        )?;
    }
    outln!("{}", explain::render(&e).trim_end())?;
    // With several scale-up domain sizes: which size wins, and why.
    if let Some(domains) = &doc.scale_up_domains {
        outln!("{}", archplace_job::domains::render(domains).trim_end())?;
    }
    Ok(Exit::Success)
}
