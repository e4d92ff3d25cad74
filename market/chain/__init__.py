"""Chain layer: contract artifacts, deployment, typed wrappers and the local devnet.

- `artifacts`: ABI and bytecode from Hardhat's `artifacts/` (`make compile`);
- `errors`: `ChainError`, and reverts raised as `ContractRevert` subclasses named after the
  custom error (`revert_class("WrongPayment")`), decoded against every compiled ABI;
- `client`: `Chain` (one RPC endpoint: signed sends, calls, events, snapshots, time),
  `anvil_account(i)`;
- `contracts`: typed wrappers `PaymentEscrow`, `GPURegistry`, `TaskRegistry`,
  `VerifierCommittee`, `Arbitration` and their struct dataclasses;
- `deployment`: the `deployment.json` file (`Deployment`), free of web3;
- `deploy`: `deploy(chain, deployer, params)`, `DeployParams`, and `Quarry` (all five
  wrappers on one connection, `Quarry.connect()` from the deployment file);
- `devnet`: Anvil from node_modules, `up`/`status`/`down`; `cli`: `market devnet ...`.

This package imports nothing heavy itself, so `market.chain.cli` stays cheap to import.
"""
