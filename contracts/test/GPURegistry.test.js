const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const {
  P, MODEL, OTHER_MODEL, GPU, PRICE, PRECISION, gasCost, deployQuarry, createTask, signReport,
} = require("./helpers");

// The start of an epoch after every registration in these tests (registeredAt is a uint64):
// setReputation counts such a report towards probation.
const LATER = 2n ** 64n;

// GPURegistry with EOAs standing in for TaskRegistry, Arbitration and VerifierCommittee,
// and a real PaymentEscrow receiving slashed stake. `miner` is established (registered with
// probation off); everyone registering later starts on probation (3 epochs, 6000 bps).
describe("GPURegistry", function () {
  async function fixture() {
    const [owner, tr, arb, com, miner, alice, bob] = await ethers.getSigners();
    const escrow = await (await ethers.getContractFactory("PaymentEscrow")).deploy();
    const gpu = await (await ethers.getContractFactory("GPURegistry")).deploy(
      P.minStake, P.minerUnbonding, P.initialRepBps);
    await escrow.setGPURegistry(gpu);
    await gpu.setTaskRegistry(tr);
    await gpu.setArbitration(arb);
    await gpu.setCommittee(com);
    await gpu.setEscrow(escrow);
    await gpu.setProbation(0, 6000);
    await gpu.connect(miner).register([MODEL], [1], GPU, "http://m", PRICE, { value: P.minStake * 2n });
    await gpu.setProbation(3, 6000);
    return { escrow, gpu, owner, tr, arb, com, miner, alice, bob };
  }

  describe("constructor and params", function () {
    it("exposes the constructor params and owner setters", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      expect(await gpu.minStake()).to.equal(P.minStake);
      expect(await gpu.unbondingPeriod()).to.equal(P.minerUnbonding);
      expect(await gpu.initialReputationBps()).to.equal(P.initialRepBps);
      expect(await gpu.untrustedBelowBps()).to.equal(4000);
      expect(await gpu.probationEpochs()).to.equal(3);
      expect(await gpu.probationPassBps()).to.equal(6000);
      await expect(gpu.setMinStake(5)).to.emit(gpu, "MinStakeSet").withArgs(5);
      await expect(gpu.setUnbondingPeriod(7)).to.emit(gpu, "UnbondingPeriodSet").withArgs(7);
      await expect(gpu.setUntrustedBelowBps(3000)).to.emit(gpu, "UntrustedBelowSet").withArgs(3000);
      await expect(gpu.setInitialReputationBps(6000)).to.emit(gpu, "InitialReputationSet").withArgs(6000);
      await expect(gpu.setUntrustedBelowBps(10001)).to.be.revertedWithCustomError(gpu, "InvalidBps");
      await expect(gpu.setInitialReputationBps(10001)).to.be.revertedWithCustomError(gpu, "InvalidBps");
      await expect(gpu.connect(alice).setMinStake(1)).to.be.revertedWithCustomError(gpu, "OwnableUnauthorizedAccount");
      const F = await ethers.getContractFactory("GPURegistry");
      await expect(F.deploy(1, 1, 10001)).to.be.revertedWithCustomError(gpu, "InvalidBps");
    });
    it("setProbation validates the pass mark, emits, and is owner only", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      await expect(gpu.setProbation(5, 7000)).to.emit(gpu, "ProbationParamsSet").withArgs(5, 7000);
      expect(await gpu.probationEpochs()).to.equal(5);
      expect(await gpu.probationPassBps()).to.equal(7000);
      await expect(gpu.setProbation(1, 10001)).to.be.revertedWithCustomError(gpu, "InvalidBps").withArgs(10001);
      await expect(gpu.setProbation(0, 10000)).to.emit(gpu, "ProbationParamsSet").withArgs(0, 10000);
      await expect(gpu.setProbation(65535, 0)).to.emit(gpu, "ProbationParamsSet").withArgs(65535, 0);
      await expect(gpu.connect(alice).setProbation(1, 1))
        .to.be.revertedWithCustomError(gpu, "OwnableUnauthorizedAccount").withArgs(alice.address);
      expect(await gpu.probationEpochs()).to.equal(65535);
      expect(await gpu.probationPassBps()).to.equal(0);
    });
    it("wiring setters are one-time and non-zero", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      for (const f of ["setTaskRegistry", "setArbitration", "setCommittee", "setEscrow"]) {
        await expect(gpu[f](alice)).to.be.revertedWithCustomError(gpu, "AlreadySet");
      }
      const fresh = await (await ethers.getContractFactory("GPURegistry")).deploy(1, 1, 1);
      for (const f of ["setTaskRegistry", "setArbitration", "setCommittee", "setEscrow"]) {
        await expect(fresh[f](ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      }
    });
  });

  describe("register", function () {
    it("registers with stake, models and their precisions, GPU, endpoint and price", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      const precisions = [PRECISION.BF16, PRECISION.INT8];
      await expect(gpu.connect(alice).register([MODEL, OTHER_MODEL], precisions, GPU, "http://a", 7, { value: P.minStake }))
        .to.emit(gpu, "MinerRegistered")
        .withArgs(alice.address, [MODEL, OTHER_MODEL], precisions, [GPU.name, GPU.memoryMiB, GPU.count], "http://a", 7, P.minStake);
      expect(await gpu.precisionOf(alice, MODEL)).to.equal(PRECISION.BF16);
      expect(await gpu.precisionOf(alice, OTHER_MODEL)).to.equal(PRECISION.INT8);
      expect(await gpu.precisionOf(alice, ethers.ZeroHash)).to.equal(0); // not served
      const info = await gpu.minerInfo(alice);
      expect(info.stake).to.equal(P.minStake);
      expect(info.locked).to.equal(0);
      expect(info.reputationBps).to.equal(P.initialRepBps);
      expect(info.pricePerToken).to.equal(7);
      expect(info.endpoint).to.equal("http://a");
      expect(info.gpu.name).to.equal(GPU.name);
      expect(info.gpu.memoryMiB).to.equal(GPU.memoryMiB);
      expect(info.gpu.count).to.equal(GPU.count);
      expect(info.exitRequestedAt).to.equal(0);
      expect(info.active).to.equal(true);
      expect(info.registeredAt).to.equal(await time.latest()); // the registration's block
      expect(info.onProbation).to.equal(true); // a fresh key starts on probation
      expect(info.passedEpochs).to.equal(0);
      expect(await gpu.onProbation(alice)).to.equal(true);
      expect(await gpu.onProbation(await gpu.owner())).to.equal(false); // never registered
      expect(await gpu.modelsOf(alice)).to.deep.equal([MODEL, OTHER_MODEL]);
      expect(await gpu.servesModel(alice, OTHER_MODEL)).to.equal(true);
      expect(await gpu.isRegistered(alice)).to.equal(true);
    });
    it("reverts on zero or low stake", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      await expect(gpu.connect(alice).register([MODEL], [1], GPU, "e", 1))
        .to.be.revertedWithCustomError(gpu, "InsufficientStake").withArgs(P.minStake, 0);
      await expect(gpu.connect(alice).register([MODEL], [1], GPU, "e", 1, { value: P.minStake - 1n }))
        .to.be.revertedWithCustomError(gpu, "InsufficientStake").withArgs(P.minStake, P.minStake - 1n);
    });
    it("reverts on bad profiles and double registration", async function () {
      const { gpu, alice, miner } = await loadFixture(fixture);
      const v = { value: P.minStake };
      const many = Array.from({ length: 17 }, (_, i) => ethers.zeroPadValue(ethers.toBeHex(i + 1), 32));
      await expect(gpu.connect(alice).register(many, many.map(() => 1), GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "TooManyModels").withArgs(16, 17);
      await expect(gpu.connect(alice).register([], [], GPU, "e", 1, v)).to.be.revertedWithCustomError(gpu, "NoModels");
      await expect(gpu.connect(alice).register([MODEL, MODEL], [1, 1], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "DuplicateModel").withArgs(MODEL);
      await expect(gpu.connect(alice).register([MODEL], [1], { ...GPU, count: 0 }, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "InvalidGpuSpec");
      await expect(gpu.connect(alice).register([MODEL], [1], { ...GPU, memoryMiB: 0 }, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "InvalidGpuSpec");
      await expect(gpu.connect(alice).register([MODEL], [1], GPU, "", 1, v)).to.be.revertedWithCustomError(gpu, "EmptyEndpoint");
      await expect(gpu.connect(miner).register([MODEL], [1], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "AlreadyRegistered").withArgs(miner.address);
      // 16 models is fine
      await gpu.connect(alice).register(many.slice(0, 16), many.slice(0, 16).map(() => 1), GPU, "e", 1, v);
    });
    it("reverts on a precision outside 1..5 or a precision list of another length", async function () {
      const { gpu, alice, bob } = await loadFixture(fixture);
      const v = { value: P.minStake };
      for (const bad of [0, 6, 255]) {
        await expect(gpu.connect(alice).register([MODEL, OTHER_MODEL], [PRECISION.FP32, bad], GPU, "e", 1, v))
          .to.be.revertedWithCustomError(gpu, "InvalidPrecision").withArgs(OTHER_MODEL, bad);
      }
      await expect(gpu.connect(alice).register([MODEL, OTHER_MODEL], [PRECISION.FP32], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "PrecisionsLengthMismatch").withArgs(2, 1);
      await expect(gpu.connect(alice).register([MODEL], [1, 1], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "PrecisionsLengthMismatch").withArgs(1, 2);
      await expect(gpu.connect(alice).register([MODEL], [], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "PrecisionsLengthMismatch").withArgs(1, 0);
      expect(await gpu.isRegistered(alice)).to.equal(false);
      // every precision the contracts know is accepted
      await gpu.connect(alice).register([MODEL], [PRECISION.INT8], GPU, "e", 1, v);
      await gpu.connect(bob).register([MODEL], [PRECISION.FP32], GPU, "e", 1, v);
      expect(await gpu.MAX_PRECISION()).to.equal(PRECISION.INT8);
    });
    it("refuses contract accounts, from a call and from a constructor (ContractAccount)", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      const proxy = await (await ethers.getContractFactory("RegisterProxy")).deploy();
      await expect(proxy.connect(alice).joinMiners(gpu, MODEL, { value: P.minStake }))
        .to.be.revertedWithCustomError(gpu, "ContractAccount").withArgs(await proxy.getAddress());
      expect(await gpu.isRegistered(proxy)).to.equal(false);
      // from a constructor the caller has no code yet, so an extcodesize check would pass it
      const F = await ethers.getContractFactory("RegisterInConstructor");
      const nonce = await ethers.provider.getTransactionCount(alice.address);
      const predicted = ethers.getCreateAddress({ from: alice.address, nonce });
      await expect(F.connect(alice).deploy(ethers.ZeroAddress, gpu, MODEL, { value: P.minStake }))
        .to.be.revertedWithCustomError(gpu, "ContractAccount").withArgs(predicted);
      expect(await gpu.isRegistered(predicted)).to.equal(false);
      expect(await ethers.provider.getBalance(gpu)).to.equal(P.minStake * 2n); // only the fixture's miner
      // the same EOA registers directly
      await gpu.connect(alice).register([MODEL], [1], GPU, "e", 1, { value: P.minStake });
      expect(await gpu.isRegistered(alice)).to.equal(true);
    });
  });

  describe("addStake / update", function () {
    it("adds stake", async function () {
      const { gpu, miner, alice } = await loadFixture(fixture);
      await expect(gpu.connect(miner).addStake({ value: 5 })).to.emit(gpu, "StakeAdded").withArgs(miner.address, 5, P.minStake * 2n + 5n);
      await expect(gpu.connect(miner).addStake()).to.be.revertedWithCustomError(gpu, "ZeroAmount");
      await expect(gpu.connect(alice).addStake({ value: 1 })).to.be.revertedWithCustomError(gpu, "NotRegistered");
    });
    it("replaces models and profile", async function () {
      const { gpu, miner, alice } = await loadFixture(fixture);
      const g2 = { name: "2x A100", memoryMiB: 40960, count: 2 };
      await expect(gpu.connect(miner).update([OTHER_MODEL], [PRECISION.FP8], g2, "http://n", 9)).to.emit(gpu, "MinerUpdated")
        .withArgs(miner.address, [OTHER_MODEL], [PRECISION.FP8], [g2.name, g2.memoryMiB, g2.count], "http://n", 9);
      expect(await gpu.servesModel(miner, MODEL)).to.equal(false);
      expect(await gpu.precisionOf(miner, MODEL)).to.equal(0); // the old model's precision is gone
      expect(await gpu.precisionOf(miner, OTHER_MODEL)).to.equal(PRECISION.FP8);
      expect(await gpu.servesModel(miner, OTHER_MODEL)).to.equal(true);
      expect(await gpu.modelsOf(miner)).to.deep.equal([OTHER_MODEL]);
      const info = await gpu.minerInfo(miner);
      expect(info.endpoint).to.equal("http://n");
      expect(info.pricePerToken).to.equal(9);
      expect(info.gpu.count).to.equal(2);
      await expect(gpu.connect(alice).update([MODEL], [1], GPU, "e", 1)).to.be.revertedWithCustomError(gpu, "NotRegistered");
      await expect(gpu.connect(miner).update([], [], GPU, "e", 1)).to.be.revertedWithCustomError(gpu, "NoModels");
      await expect(gpu.connect(miner).update([MODEL], [0], GPU, "e", 1))
        .to.be.revertedWithCustomError(gpu, "InvalidPrecision").withArgs(MODEL, 0);
      await expect(gpu.connect(miner).update([MODEL, OTHER_MODEL], [1], GPU, "e", 1))
        .to.be.revertedWithCustomError(gpu, "PrecisionsLengthMismatch").withArgs(2, 1);
      // the same model again with another precision: the declaration changes
      await gpu.connect(miner).update([OTHER_MODEL, MODEL], [PRECISION.FP16, PRECISION.BF16], GPU, "e", 1);
      expect(await gpu.precisionOf(miner, MODEL)).to.equal(PRECISION.BF16);
      expect(await gpu.precisionOf(miner, OTHER_MODEL)).to.equal(PRECISION.FP16);
    });
  });

  describe("exit", function () {
    it("requestExit then withdrawStake after unbonding, to the wei", async function () {
      const { gpu, miner } = await loadFixture(fixture);
      expect(await gpu.eligiblePrecision(miner, MODEL, 0, false)).to.equal(PRECISION.FP32);
      expect(await gpu.eligiblePrecision(miner, OTHER_MODEL, 0, false)).to.equal(0); // not served
      expect(await gpu.eligiblePrecision(miner, MODEL, P.initialRepBps + 1, false)).to.equal(0); // floor
      const tx0 = await gpu.connect(miner).requestExit();
      const t0 = BigInt(await time.latest());
      await expect(tx0).to.emit(gpu, "ExitRequested").withArgs(miner.address, t0 + P.minerUnbonding);
      expect((await gpu.minerInfo(miner)).exitRequestedAt).to.equal(t0);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(false);
      expect(await gpu.eligiblePrecision(miner, MODEL, 0, true)).to.equal(0);
      expect(await gpu.precisionOf(miner, MODEL)).to.equal(PRECISION.FP32); // still declared
      await expect(gpu.connect(miner).requestExit()).to.be.revertedWithCustomError(gpu, "AlreadyExiting");
      await expect(gpu.connect(miner).withdrawStake())
        .to.be.revertedWithCustomError(gpu, "UnbondingNotOver").withArgs(t0 + P.minerUnbonding);
      await time.setNextBlockTimestamp(t0 + P.minerUnbonding);
      const before = await ethers.provider.getBalance(miner);
      const tx = await gpu.connect(miner).withdrawStake();
      await expect(tx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, P.minStake * 2n);
      expect((await ethers.provider.getBalance(miner)) - before + (await gasCost(tx))).to.equal(P.minStake * 2n);
      expect(await gpu.isRegistered(miner)).to.equal(false);
      expect(await gpu.servesModel(miner, MODEL)).to.equal(false);
      expect(await gpu.precisionOf(miner, MODEL)).to.equal(0);
      expect(await ethers.provider.getBalance(gpu)).to.equal(0);
      const gone = await gpu.minerInfo(miner);
      expect(gone.stake).to.equal(0);
      expect(gone.active).to.equal(false);
      expect(gone.registeredAt).to.equal(0);
      expect(gone.onProbation).to.equal(false);
      // may register again, reputation back to the initial value, but on probation
      await gpu.connect(miner).register([MODEL], [1], GPU, "e", 1, { value: P.minStake });
      const again = await gpu.minerInfo(miner);
      expect(again.registeredAt).to.equal(await time.latest());
      expect(again.reputationBps).to.equal(P.initialRepBps);
      expect(again.onProbation).to.equal(true);
      expect(again.passedEpochs).to.equal(0);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(true);
    });
    it("withdrawStake reverts without exit, and while collateral is locked", async function () {
      const { gpu, tr, miner, alice } = await loadFixture(fixture);
      await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "NotExiting");
      await expect(gpu.connect(alice).withdrawStake()).to.be.revertedWithCustomError(gpu, "NotRegistered");
      await expect(gpu.connect(alice).requestExit()).to.be.revertedWithCustomError(gpu, "NotRegistered");
      await gpu.connect(tr).lockCollateral(miner, 10);
      await gpu.connect(miner).requestExit();
      await time.increase(P.minerUnbonding);
      await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "StakeLocked").withArgs(10);
      // Settling records when: the withdrawal then waits for the committee's verdict report
      // on it (Exit.test.js, with a deployed committee).
      await gpu.connect(tr).unlockCollateral(miner, 10);
      expect((await gpu.minerInfo(miner)).settledAt).to.equal(await time.latest());
    });
  });

  describe("collateral", function () {
    it("locks and unlocks free stake (TaskRegistry only)", async function () {
      const { gpu, tr, arb, miner, alice } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      // the last untrustedSlashBps (10%) of the stake is never locked: it backs the untrusted burn
      const most = stake - stake / 10n;
      await expect(gpu.connect(tr).lockCollateral(miner, most - 1n)).to.emit(gpu, "CollateralLocked").withArgs(miner.address, most - 1n, most - 1n);
      await expect(gpu.connect(tr).lockCollateral(miner, 2))
        .to.be.revertedWithCustomError(gpu, "InsufficientFreeStake").withArgs(1, 2);
      await expect(gpu.connect(arb).lockCollateral(miner, 1)).to.be.revertedWithCustomError(gpu, "Unauthorized");
      await expect(gpu.connect(tr).lockCollateral(alice, 1)).to.be.revertedWithCustomError(gpu, "NotRegistered");
      await expect(gpu.connect(tr).unlockCollateral(miner, stake))
        .to.be.revertedWithCustomError(gpu, "UnlockExceedsLocked").withArgs(most - 1n, stake);
      await expect(gpu.connect(arb).unlockCollateral(miner, 1)).to.be.revertedWithCustomError(gpu, "Unauthorized");
      await expect(gpu.connect(tr).unlockCollateral(miner, 5)).to.emit(gpu, "CollateralUnlocked").withArgs(miner.address, 5, most - 6n);
      expect((await gpu.minerInfo(miner)).locked).to.equal(most - 6n);
    });
  });

  describe("slash", function () {
    it("takes stake into the beneficiary's escrow credit (TaskRegistry or Arbitration)", async function () {
      const { gpu, escrow, tr, arb, miner, alice, bob } = await loadFixture(fixture);
      await expect(gpu.connect(arb).slash(miner, 1000, alice))
        .to.emit(gpu, "Slashed").withArgs(miner.address, 1000, alice.address, arb.address);
      await gpu.connect(tr).slash(miner, 1, bob);
      expect(await escrow.withdrawable(alice)).to.equal(1000);
      expect(await escrow.withdrawable(bob)).to.equal(1);
      expect((await gpu.minerInfo(miner)).stake).to.equal(P.minStake * 2n - 1001n);
      expect(await ethers.provider.getBalance(gpu)).to.equal(P.minStake * 2n - 1001n);
      expect(await ethers.provider.getBalance(escrow)).to.equal(1001);
    });
    it("takes only free stake: an open shard's collateral stays locked and whole, so it can still be unlocked", async function () {
      const { gpu, escrow, tr, arb, miner, alice } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      const locked = (stake * 3n) / 4n;
      await gpu.connect(tr).lockCollateral(miner, locked);
      // asked for more than is free: takes the free part only, the lock is untouched
      await expect(gpu.connect(arb).slash(miner, stake / 2n, alice))
        .to.emit(gpu, "Slashed").withArgs(miner.address, stake - locked, alice.address, arb.address);
      let info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(locked);
      expect(info.locked).to.equal(locked);
      await expect(gpu.connect(arb).slash(miner, 1, alice)).not.to.emit(gpu, "Slashed");
      // the shard's settlement unlocks all of it (UnlockExceedsLocked before), then may slash it
      await gpu.connect(tr).unlockCollateral(miner, locked);
      await gpu.connect(arb).slash(miner, stake, alice);
      info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(0);
      expect(info.locked).to.equal(0);
      expect(await escrow.withdrawable(alice)).to.equal(stake);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false); // below minStake
      await expect(gpu.connect(arb).slash(miner, 1, alice)).not.to.emit(gpu, "Slashed");
    });
    it("reverts for others, to zero, and unwired", async function () {
      const { gpu, com, arb, miner, alice } = await loadFixture(fixture);
      await expect(gpu.connect(com).slash(miner, 1, alice)).to.be.revertedWithCustomError(gpu, "Unauthorized");
      await expect(gpu.connect(arb).slash(miner, 1, ethers.ZeroAddress)).to.be.revertedWithCustomError(gpu, "ZeroAddress");
      const fresh = await (await ethers.getContractFactory("GPURegistry")).deploy(1, 1, 1);
      await fresh.setArbitration(arb);
      await expect(fresh.connect(arb).slash(miner, 1, alice)).to.be.revertedWithCustomError(fresh, "NotWired");
    });
  });

  describe("consequences of untrust", function () {
    const BURN = "0x000000000000000000000000000000000000dEaD";
    it("every report after the first in a row that leaves a miner untrusted burns 10% of its stake; a trusted one resets the count", async function () {
      const { gpu, escrow, com, miner } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      await gpu.connect(com).setReputation(miner, 3999, LATER); // first: no slash
      expect(await gpu.untrustedReportsOf(miner)).to.equal(1);
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake);
      const burn1 = stake / 10n;
      await expect(gpu.connect(com).setReputation(miner, 3500, LATER))
        .to.emit(gpu, "Slashed").withArgs(miner.address, burn1, BURN, com.address);
      const burn2 = (stake - burn1) / 10n;
      await gpu.connect(com).setReputation(miner, 2000, LATER);
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake - burn1 - burn2);
      expect(await escrow.withdrawable(BURN)).to.equal(burn1 + burn2);
      expect(await gpu.untrustedReportsOf(miner)).to.equal(3);
      await gpu.connect(com).setReputation(miner, 4000, LATER);
      expect(await gpu.untrustedReportsOf(miner)).to.equal(0);
      await gpu.connect(com).setReputation(miner, 3999, LATER); // a new streak starts unpunished
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake - burn1 - burn2);
      await expect(gpu.setUntrustedPenalty(10001, 0)).to.be.revertedWithCustomError(gpu, "InvalidBps").withArgs(10001);
      await expect(gpu.connect(miner).setUntrustedPenalty(0, 0)).to.be.revertedWithCustomError(gpu, "OwnableUnauthorizedAccount");
      await expect(gpu.setUntrustedPenalty(0, 5n)).to.emit(gpu, "UntrustedPenaltySet").withArgs(0, 5n);
      await gpu.connect(com).setReputation(miner, 3999, LATER);
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake - burn1 - burn2); // 0 bps: none
    });
    it("the burn takes free stake only: collateral locked by open shards stays whole and can still be unlocked", async function () {
      const { gpu, escrow, tr, com, miner } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      const free = stake / 10n; // the 10% no claim may lock: the first burn takes all of it
      await gpu.connect(tr).lockCollateral(miner, stake - free);
      await gpu.connect(com).setReputation(miner, 3999, LATER);
      await gpu.connect(com).setReputation(miner, 3999, LATER);
      const info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(stake - free);
      expect(info.locked).to.equal(stake - free);
      expect(await escrow.withdrawable(BURN)).to.equal(free);
      await gpu.connect(com).setReputation(miner, 3999, LATER); // nothing free: nothing burned
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake - free);
      await gpu.connect(tr).unlockCollateral(miner, stake - free); // the open shards settle
      expect((await gpu.minerInfo(miner)).locked).to.equal(0);
    });
    it("an untrusted miner pays the fee (burned) to be challenged again: back on probation, eligible for challenge-like tasks until the next report", async function () {
      const { gpu, escrow, com, miner, alice } = await loadFixture(fixture);
      const fee = await gpu.rechallengeFee();
      expect(fee).to.equal(ethers.parseEther("0.01"));
      await expect(gpu.connect(miner).requestRechallenge({ value: fee }))
        .to.be.revertedWithCustomError(gpu, "NotUntrusted").withArgs(miner.address, P.initialRepBps);
      await expect(gpu.connect(alice).requestRechallenge({ value: fee }))
        .to.be.revertedWithCustomError(gpu, "NotRegistered").withArgs(alice.address);
      await gpu.connect(com).setReputation(miner, 3000, LATER);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(false);
      await expect(gpu.connect(miner).requestRechallenge({ value: fee - 1n }))
        .to.be.revertedWithCustomError(gpu, "WrongFee").withArgs(fee, fee - 1n);
      // It also pays the burn the first untrusted report spared (issue 32): 10% of its stake.
      const stake0 = (await gpu.minerInfo(miner)).stake;
      await expect(gpu.connect(miner).requestRechallenge({ value: fee }))
        .to.emit(gpu, "RechallengeRequested").withArgs(miner.address, fee)
        .and.to.emit(gpu, "Slashed").withArgs(miner.address, stake0 / 10n, BURN, miner.address);
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake0 - stake0 / 10n);
      expect(await gpu.untrustedReportsOf(miner)).to.equal(2);
      expect(await escrow.withdrawable(BURN)).to.equal(fee + stake0 / 10n);
      await expect(gpu.connect(miner).requestRechallenge({ value: fee }))
        .to.be.revertedWithCustomError(gpu, "RechallengeAlreadyPending").withArgs(miner.address);
      expect(await gpu.onProbation(miner)).to.equal(true);
      expect(await gpu.rechallengePending(miner)).to.equal(true);
      // eligible for the committee's challenges (probation allowed, no reputation floor) only
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(true);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false);
      expect(await gpu.isEligible(miner, MODEL, 5000, true)).to.equal(false);
      expect(await gpu.isEligible(miner, OTHER_MODEL, 0, true)).to.equal(false);
      // the next report decides: passed, it is trusted again (still on probation)
      await gpu.connect(com).setReputation(miner, 5450, LATER);
      expect(await gpu.rechallengePending(miner)).to.equal(false);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(true);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false); // probation
      // failed again: untrusted, the streak goes on (second in a row: stake burned)
      await gpu.connect(com).setReputation(miner, 3000, LATER);
      await gpu.connect(miner).requestRechallenge({ value: fee });
      const before = (await gpu.minerInfo(miner)).stake;
      await gpu.connect(com).setReputation(miner, 2100, LATER);
      expect((await gpu.minerInfo(miner)).stake).to.equal(before - before / 10n);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(false);
      // exiting miners cannot ask
      await gpu.connect(miner).requestExit();
      await expect(gpu.connect(miner).requestRechallenge({ value: fee }))
        .to.be.revertedWithCustomError(gpu, "AlreadyExiting").withArgs(miner.address);
    });
  });

  describe("missing is not failing (recordMissed)", function () {
    const BURN = "0x000000000000000000000000000000000000dEaD";
    it("a missed report keeps reputation, stake and the probation count; past missedReportsAllowed in a row, probation again", async function () {
      const { gpu, escrow, com, miner, alice } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      await gpu.connect(com).setReputation(miner, 7000, LATER);
      expect(await gpu.missedReportsAllowed()).to.equal(2);
      for (const k of [1, 2]) {
        await expect(gpu.connect(com).recordMissed(miner))
          .to.emit(gpu, "ReportMissed").withArgs(miner.address, k, false)
          .and.not.to.emit(gpu, "ReputationSet");
        const info = await gpu.minerInfo(miner);
        expect([info.reputationBps, info.stake, info.onProbation]).to.deep.equal([7000n, stake, false]);
        expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(true); // still ordinary work
      }
      expect(await gpu.untrustedReportsOf(miner)).to.equal(0);
      // the third in a row: back on probation (challenges only), no stake taken
      await expect(gpu.connect(com).recordMissed(miner)).to.emit(gpu, "ReportMissed").withArgs(miner.address, 3, true);
      const info = await gpu.minerInfo(miner);
      expect([info.reputationBps, info.stake, info.onProbation, info.passedEpochs]).to.deep.equal([7000n, stake, true, 0n]);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(true); // the committee still challenges it
      await expect(gpu.connect(com).recordMissed(miner)).to.emit(gpu, "ReportMissed").withArgs(miner.address, 4, false);
      expect(await escrow.withdrawable(BURN)).to.equal(0);
      // a scored report ends the run; passing reports end the probation as for a new miner
      await gpu.connect(com).setReputation(miner, 7300, LATER);
      expect(await gpu.missedReportsOf(miner)).to.equal(0);
      expect((await gpu.minerInfo(miner)).passedEpochs).to.equal(1);
      // a miss on probation neither counts nor restarts the count
      await gpu.connect(com).recordMissed(miner);
      expect((await gpu.minerInfo(miner)).passedEpochs).to.equal(1);
      await gpu.connect(com).setReputation(miner, 7500, LATER);
      await expect(gpu.connect(com).setReputation(miner, 7700, LATER)).to.emit(gpu, "ProbationEnded").withArgs(miner.address);
      // committee only; registered miners only; owner sets the allowance
      await expect(gpu.connect(alice).recordMissed(miner)).to.be.revertedWithCustomError(gpu, "Unauthorized").withArgs(alice.address);
      await expect(gpu.connect(com).recordMissed(alice)).to.be.revertedWithCustomError(gpu, "NotRegistered").withArgs(alice.address);
      await expect(gpu.connect(miner).setMissedReportsAllowed(0)).to.be.revertedWithCustomError(gpu, "OwnableUnauthorizedAccount");
      await expect(gpu.setMissedReportsAllowed(0)).to.emit(gpu, "MissedReportsAllowedSet").withArgs(0);
      await expect(gpu.connect(com).recordMissed(miner)).to.emit(gpu, "ReportMissed").withArgs(miner.address, 1, true);
    });
    it("a missed report never burns stake, even for an untrusted miner, and uses up a pending re-challenge", async function () {
      const { gpu, escrow, com, miner } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      await gpu.connect(com).setReputation(miner, 3000, LATER); // failed: untrusted (first, no burn)
      const fee = await gpu.rechallengeFee();
      await gpu.connect(miner).requestRechallenge({ value: fee });
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(true);
      await gpu.connect(com).recordMissed(miner); // it did not answer the re-challenge
      expect(await gpu.rechallengePending(miner)).to.equal(false);
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(false); // it pays again to be challenged
      await gpu.connect(com).recordMissed(miner);
      // the re-challenge paid the first report's burn (issue 32); the misses burned nothing
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake - stake / 10n);
      expect(await gpu.untrustedReportsOf(miner)).to.equal(2);
      expect(await escrow.withdrawable(BURN)).to.equal(fee + stake / 10n);
      await gpu.connect(miner).requestRechallenge({ value: fee }); // asking again: the fee only
      expect((await gpu.minerInfo(miner)).stake).to.equal(stake - stake / 10n);
    });
    it("re-registering clears the count", async function () {
      const { gpu, com, miner } = await loadFixture(fixture);
      await gpu.connect(com).recordMissed(miner);
      await gpu.connect(miner).requestExit();
      await time.increase(P.minerUnbonding);
      await gpu.connect(miner).withdrawStake();
      await gpu.connect(miner).register([MODEL], [1], GPU, "http://m", PRICE, { value: P.minStake });
      expect(await gpu.missedReportsOf(miner)).to.equal(0);
    });
  });

  describe("reputation and eligibility", function () {
    it("setReputation is committee only and bounded", async function () {
      const { gpu, com, tr, miner, alice } = await loadFixture(fixture);
      await expect(gpu.connect(com).setReputation(miner, 9000, LATER)).to.emit(gpu, "ReputationSet").withArgs(miner.address, 9000);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(9000);
      await expect(gpu.connect(tr).setReputation(miner, 1, LATER))
        .to.be.revertedWithCustomError(gpu, "Unauthorized").withArgs(tr.address);
      await expect(gpu.connect(com).setReputation(miner, 10001, LATER)).to.be.revertedWithCustomError(gpu, "InvalidBps").withArgs(10001);
      await expect(gpu.connect(com).setReputation(alice, 1, LATER))
        .to.be.revertedWithCustomError(gpu, "NotRegistered").withArgs(alice.address);
    });
    it("isEligible: registered, not exiting, serves model, reputation >= max(min, untrusted), either probation flag", async function () {
      const { gpu, com, miner, alice } = await loadFixture(fixture);
      // an established miner: allowProbation changes nothing
      for (const ap of [false, true]) {
        await gpu.connect(com).setReputation(miner, 5000, LATER);
        expect(await gpu.isEligible(miner, MODEL, 0, ap)).to.equal(true);
        expect(await gpu.isEligible(miner, MODEL, 5000, ap)).to.equal(true);
        expect(await gpu.isEligible(miner, MODEL, 5001, ap)).to.equal(false);
        expect(await gpu.isEligible(miner, OTHER_MODEL, 0, ap)).to.equal(false);
        expect(await gpu.isEligible(alice, MODEL, 0, ap)).to.equal(false); // not registered
        await gpu.connect(com).setReputation(miner, 3999, LATER);
        expect(await gpu.isEligible(miner, MODEL, 0, ap)).to.equal(false); // untrusted floor
        await gpu.connect(com).setReputation(miner, 4000, LATER);
        expect(await gpu.isEligible(miner, MODEL, 0, ap)).to.equal(true);
        await gpu.setUntrustedBelowBps(4500);
        expect(await gpu.isEligible(miner, MODEL, 0, ap)).to.equal(false);
        expect(await gpu.isEligible(miner, MODEL, 4500, ap)).to.equal(false);
        await gpu.setUntrustedBelowBps(4000);
        await gpu.setMinStake(P.minStake * 2n + 1n);
        expect(await gpu.isEligible(miner, MODEL, 0, ap)).to.equal(false); // stake below minStake
        await gpu.setMinStake(P.minStake * 2n);
        expect(await gpu.isEligible(miner, MODEL, 0, ap)).to.equal(true);
      }
      expect(await gpu.onProbation(miner)).to.equal(false);
    });
    it("a miner on probation is eligible only with allowProbation, and the other floors still apply", async function () {
      const { gpu, com, alice } = await loadFixture(fixture);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(false);
      expect(await gpu.isEligible(alice, MODEL, 5000, false)).to.equal(false);
      expect(await gpu.isEligible(alice, MODEL, 0, true)).to.equal(true);
      expect(await gpu.isEligible(alice, MODEL, 5000, true)).to.equal(true);
      expect(await gpu.isEligible(alice, MODEL, 5001, true)).to.equal(false);
      expect(await gpu.isEligible(alice, OTHER_MODEL, 0, true)).to.equal(false);
      await gpu.connect(com).setReputation(alice, 3999, LATER);
      expect(await gpu.isEligible(alice, MODEL, 0, true)).to.equal(false);
      await gpu.connect(com).setReputation(alice, 4000, LATER);
      expect(await gpu.isEligible(alice, MODEL, 0, true)).to.equal(true);
      await gpu.setMinStake(P.minStake + 1n);
      expect(await gpu.isEligible(alice, MODEL, 0, true)).to.equal(false);
      await gpu.setMinStake(P.minStake);
      await gpu.connect(alice).requestExit();
      expect(await gpu.isEligible(alice, MODEL, 0, true)).to.equal(false);
    });
  });

  describe("probation", function () {
    const info = async (gpu, m) => {
      const i = await gpu.minerInfo(m);
      return [i.onProbation, Number(i.passedEpochs), Number(i.reputationBps)];
    };
    it("ends after probationEpochs consecutive reports >= probationPassBps; a report below resets the count", async function () {
      const { gpu, com, alice } = await loadFixture(fixture);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      expect(await info(gpu, alice)).to.deep.equal([true, 0, 5000]);
      await expect(gpu.connect(com).setReputation(alice, 6000, LATER)).not.to.emit(gpu, "ProbationEnded");
      expect(await info(gpu, alice)).to.deep.equal([true, 1, 6000]);
      await gpu.connect(com).setReputation(alice, 10000, LATER);
      expect(await info(gpu, alice)).to.deep.equal([true, 2, 10000]);
      // one epoch below the pass mark restarts the count
      await expect(gpu.connect(com).setReputation(alice, 5999, LATER))
        .to.emit(gpu, "ReputationSet").withArgs(alice.address, 5999)
        .and.not.to.emit(gpu, "ProbationEnded");
      expect(await info(gpu, alice)).to.deep.equal([true, 0, 5999]);
      await gpu.connect(com).setReputation(alice, 6000, LATER);
      await gpu.connect(com).setReputation(alice, 6001, LATER);
      expect(await info(gpu, alice)).to.deep.equal([true, 2, 6001]);
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(false);
      await expect(gpu.connect(com).setReputation(alice, 7000, LATER))
        .to.emit(gpu, "ProbationEnded").withArgs(alice.address);
      expect(await info(gpu, alice)).to.deep.equal([false, 3, 7000]);
      expect(await gpu.onProbation(alice)).to.equal(false);
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(true);
      // off probation, later reports only write the reputation
      await expect(gpu.connect(com).setReputation(alice, 6500, LATER)).not.to.emit(gpu, "ProbationEnded");
      await gpu.connect(com).setReputation(alice, 100, LATER);
      expect(await info(gpu, alice)).to.deep.equal([false, 3, 100]);
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(false); // untrusted, not on probation
    });
    it("counts only reports of epochs that started at or after the registration; earlier ones only write the score", async function () {
      const { gpu, com, alice } = await loadFixture(fixture);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      const reg = BigInt(await time.latest());
      expect((await gpu.minerInfo(alice)).registeredAt).to.equal(reg);
      // epochs that started before the registration (even by one second): written, not counted
      for (const start of [0n, reg - 60n, reg - 1n]) {
        await expect(gpu.connect(com).setReputation(alice, 9000, start))
          .to.emit(gpu, "ReputationSet").withArgs(alice.address, 9000)
          .and.not.to.emit(gpu, "ProbationEnded");
        expect(await info(gpu, alice)).to.deep.equal([true, 0, 9000]);
      }
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(false);
      // an epoch that started in the registration's second counts, and every later one
      await gpu.connect(com).setReputation(alice, 6000, reg);
      expect(await info(gpu, alice)).to.deep.equal([true, 1, 6000]);
      await gpu.connect(com).setReputation(alice, 6000, reg + 60n);
      expect(await info(gpu, alice)).to.deep.equal([true, 2, 6000]);
      // a failing report of an earlier epoch does not restart the count either; its score is written
      await expect(gpu.connect(com).setReputation(alice, 100, reg - 1n))
        .to.emit(gpu, "ReputationSet").withArgs(alice.address, 100);
      expect(await info(gpu, alice)).to.deep.equal([true, 2, 100]);
      expect(await gpu.isEligible(alice, MODEL, 0, true)).to.equal(false); // untrusted
      await expect(gpu.connect(com).setReputation(alice, 6000, reg + 120n))
        .to.emit(gpu, "ProbationEnded").withArgs(alice.address);
      expect(await info(gpu, alice)).to.deep.equal([false, 3, 6000]);
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(true);
      // off probation the epoch does not matter: the score is written
      await expect(gpu.connect(com).setReputation(alice, 4000, 0)).not.to.emit(gpu, "ProbationEnded");
      expect(await info(gpu, alice)).to.deep.equal([false, 3, 4000]);
    });
    it("registering again moves registeredAt: epochs of the earlier registration no longer count", async function () {
      const { gpu, com, alice } = await loadFixture(fixture);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      const first = BigInt(await time.latest());
      await gpu.connect(com).setReputation(alice, 9000, first);
      expect(await info(gpu, alice)).to.deep.equal([true, 1, 9000]);
      await gpu.connect(alice).requestExit();
      await time.increase(P.minerUnbonding);
      await gpu.connect(alice).withdrawStake();
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      const second = BigInt(await time.latest());
      expect(second > first + P.minerUnbonding).to.equal(true);
      expect((await gpu.minerInfo(alice)).registeredAt).to.equal(second);
      expect(await info(gpu, alice)).to.deep.equal([true, 0, P.initialRepBps]);
      for (const start of [first, second - 1n]) {
        await expect(gpu.connect(com).setReputation(alice, 9000, start)).not.to.emit(gpu, "ProbationEnded");
        expect(await info(gpu, alice)).to.deep.equal([true, 0, 9000]);
      }
      await gpu.connect(com).setReputation(alice, 9000, second);
      expect(await info(gpu, alice)).to.deep.equal([true, 1, 9000]);
    });
    it("the pass mark is inclusive, whatever it is set to", async function () {
      const { gpu, com, alice } = await loadFixture(fixture);
      await gpu.setProbation(2, 4000);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      await gpu.connect(com).setReputation(alice, 3999, LATER);
      expect(await info(gpu, alice)).to.deep.equal([true, 0, 3999]);
      await gpu.connect(com).setReputation(alice, 4000, LATER);
      await expect(gpu.connect(com).setReputation(alice, 4000, LATER)).to.emit(gpu, "ProbationEnded").withArgs(alice.address);
      expect(await info(gpu, alice)).to.deep.equal([false, 2, 4000]);
    });
    it("setProbation applies to miners already on probation", async function () {
      const { gpu, com, alice, bob } = await loadFixture(fixture);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      await gpu.connect(bob).register([MODEL], [1], GPU, "http://b", 1, { value: P.minStake });
      await gpu.connect(com).setReputation(alice, 6000, LATER);
      await gpu.connect(com).setReputation(bob, 6000, LATER);
      // a higher pass mark: 7000 no longer passes and resets
      await gpu.setProbation(3, 8000);
      await gpu.connect(com).setReputation(alice, 7000, LATER);
      expect(await info(gpu, alice)).to.deep.equal([true, 0, 7000]);
      // fewer epochs: bob's next pass ends it (2 >= 2)
      await gpu.setProbation(2, 6000);
      await expect(gpu.connect(com).setReputation(bob, 6000, LATER)).to.emit(gpu, "ProbationEnded").withArgs(bob.address);
      expect(await info(gpu, bob)).to.deep.equal([false, 2, 6000]);
    });
    it("probationEpochs 0 disables probation for new miners; those already on it leave at their next pass", async function () {
      const { gpu, com, alice, bob } = await loadFixture(fixture);
      await gpu.connect(alice).register([MODEL], [1], GPU, "http://a", 1, { value: P.minStake });
      await gpu.setProbation(0, 6000);
      await gpu.connect(bob).register([MODEL], [1], GPU, "http://b", 1, { value: P.minStake });
      expect(await info(gpu, bob)).to.deep.equal([false, 0, 5000]);
      expect(await gpu.isEligible(bob, MODEL, 0, false)).to.equal(true);
      await expect(gpu.connect(com).setReputation(bob, 9000, LATER)).not.to.emit(gpu, "ProbationEnded");
      expect(await info(gpu, bob)).to.deep.equal([false, 0, 9000]);
      // alice registered under the old params: still on probation until a passing report
      expect(await gpu.isEligible(alice, MODEL, 0, false)).to.equal(false);
      await gpu.connect(com).setReputation(alice, 5999, LATER);
      expect(await info(gpu, alice)).to.deep.equal([true, 0, 5999]);
      await expect(gpu.connect(com).setReputation(alice, 6000, LATER)).to.emit(gpu, "ProbationEnded").withArgs(alice.address);
      expect(await info(gpu, alice)).to.deep.equal([false, 1, 6000]);
    });
    it("an established miner that withdraws and registers again is back on probation", async function () {
      const { gpu, com, miner } = await loadFixture(fixture);
      await gpu.connect(com).setReputation(miner, 9500, LATER);
      await gpu.connect(miner).requestExit();
      await time.increase(P.minerUnbonding);
      await gpu.connect(miner).withdrawStake();
      await gpu.connect(miner).register([MODEL], [1], GPU, "http://m", 1, { value: P.minStake });
      expect(await info(gpu, miner)).to.deep.equal([true, 0, P.initialRepBps]);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false);
    });
  });

  // The attack of issue gap 6, "a reputation is free to reset", on the deployed system: an
  // untrusted miner exits and re-registers (or a fresh key registers) to start again at the
  // initial reputation. It now starts on probation and must earn three consecutive passing
  // committee epochs (reports signed by a stake-weighted quorum, one per epoch, in order).
  describe("probation attack: re-registering does not reset an untrusted reputation", function () {
    async function report(q, epoch, miners, scores, signers = q.verifiers.slice(0, 3)) {
      const start = await q.committee.epochStart(epoch);
      if (BigInt(await time.latest()) < start) await time.increaseTo(start);
      const r = { epoch, miners: miners.map((m) => m.address), scoresBps: scores, evidenceRoot: ethers.id(`ev-${epoch}`) };
      const sigs = await signReport(q.committee, signers, r);
      return q.committee.submitReputation(r.epoch, r.miners, r.scoresBps, r.evidenceRoot, sigs);
    }
    const info = async (gpu, m) => {
      const i = await gpu.minerInfo(m);
      return [i.onProbation, Number(i.passedEpochs), Number(i.reputationBps)];
    };

    it("exit, unbond, withdraw and register again (and a fresh key): on probation for 3 passing epochs", async function () {
      const q = await loadFixture(deployQuarry);
      const { gpu, task, committee, client, miner, outsider, verifiers } = q;
      expect(await gpu.onProbation(miner)).to.equal(false);
      const e1 = await committee.currentEpoch();
      expect(await committee.nextReportEpoch()).to.equal(0);
      expect(await committee.memberCountAt(e1)).to.equal(4);

      // The committee writes the miner below the untrusted floor; two of four equal stakes are
      // not a quorum (> 2/3 of the weight), three are.
      const q1 = await committee.quorumWeight(e1);
      expect(q1).to.equal((P.minVerifierStake * 4n * 2n) / 3n + 1n);
      await expect(report(q, e1, [miner], [3000], verifiers.slice(0, 2)))
        .to.be.revertedWithCustomError(committee, "QuorumNotReached").withArgs(q1, P.minVerifierStake * 2n);
      await expect(report(q, e1, [miner], [3000])).to.emit(gpu, "ReputationSet").withArgs(miner.address, 3000);
      const ordinary = await createTask(task, client);
      const open = await createTask(task, client, { allowProbation: true, deadline: BigInt(await time.latest()) + 7200n });
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(false); // untrusted: no task at all
      await expect(task.connect(miner).claimShard(ordinary.taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(miner.address);
      await expect(task.connect(miner).claimShard(open.taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(miner.address);

      // The attack: exit, wait out the unbonding period, withdraw, register again. Leaving
      // untrusted takes the untrusted burn with it (issue 32): 10% of the stake is burned.
      await gpu.connect(miner).requestExit();
      await time.increase(P.minerUnbonding);
      const before = await ethers.provider.getBalance(miner);
      const wtx = await gpu.connect(miner).withdrawStake();
      const kept = P.minStake - (P.minStake * 1000n) / 10000n;
      await expect(wtx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, kept);
      expect((await ethers.provider.getBalance(miner)) - before + (await gasCost(wtx))).to.equal(kept);
      await gpu.connect(miner).register([MODEL], [1], GPU, "http://again", PRICE, { value: P.minStake });
      expect(await info(gpu, miner)).to.deep.equal([true, 0, P.initialRepBps]); // 5000: above the floor ...
      expect(await gpu.onProbation(miner)).to.equal(true);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(false); // ... but on probation
      expect(await gpu.isEligible(miner, MODEL, 0, true)).to.equal(true);
      // A fresh key fares no better.
      await gpu.connect(outsider).register([MODEL], [1], GPU, "http://fresh", PRICE, { value: P.minStake });
      expect(await info(gpu, outsider)).to.deep.equal([true, 0, P.initialRepBps]);
      expect(await gpu.isEligible(outsider, MODEL, 0, false)).to.equal(false);

      // Neither may claim an ordinary task; both may claim a task that opted in.
      for (const m of [miner, outsider]) {
        await expect(task.connect(m).claimShard(ordinary.taskId, 0))
          .to.be.revertedWithCustomError(task, "NotEligible").withArgs(m.address);
      }
      await expect(task.connect(miner).claimShard(open.taskId, 0)).to.emit(task, "ShardClaimed");
      await expect(task.connect(outsider).claimShard(open.taskId, 1)).to.emit(task, "ShardClaimed");
      expect((await task.getShard(open.taskId, 0)).miner).to.equal(miner.address);
      expect((await task.getShard(open.taskId, 1)).miner).to.equal(outsider.address);

      // Reports go in epoch order, one per epoch: the epoch already reported and a future one are
      // refused. (The unbonding period took the clock past e1; start at a fresh epoch boundary.)
      await time.increaseTo(await committee.epochStart((await committee.currentEpoch()) + 1n));
      const e = await committee.currentEpoch();
      expect(e > e1).to.equal(true);
      await expect(report(q, e1, [miner], [9000]))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e1, e1 + 1n);
      const r2 = { epoch: e + 1n, miners: [miner.address], scoresBps: [9000], evidenceRoot: ethers.id("x") };
      await expect(committee.submitReputation(r2.epoch, r2.miners, r2.scoresBps, r2.evidenceRoot,
        await signReport(committee, verifiers.slice(0, 3), r2)))
        .to.be.revertedWithCustomError(committee, "WrongEpoch").withArgs(e + 1n, e);

      // e: miner passes (1), outsider just below the pass mark (0)
      await report(q, e, [miner, outsider], [6000, 5999]);
      expect(await info(gpu, miner)).to.deep.equal([true, 1, 6000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 0, 5999]);
      await expect(report(q, e, [miner], [6000])) // a second report for the same epoch
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e, e + 1n);
      // e+1: miner fails (reset), outsider passes (1)
      await report(q, e + 1n, [miner, outsider], [5999, 9000]);
      expect(await info(gpu, miner)).to.deep.equal([true, 0, 5999]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 1, 9000]);
      // e+2: both pass
      await report(q, e + 2n, [miner, outsider], [6000, 9000]);
      expect(await info(gpu, miner)).to.deep.equal([true, 1, 6000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 2, 9000]);
      await expect(task.connect(outsider).claimShard(ordinary.taskId, 0))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(outsider.address);
      // e+3: the outsider's third consecutive pass ends its probation
      const rc = await (await report(q, e + 3n, [miner, outsider], [6000, 9000])).wait();
      const ended = rc.logs.map((l) => { try { return gpu.interface.parseLog(l); } catch { return null; } })
        .filter((x) => x && x.name === "ProbationEnded").map((x) => x.args.miner);
      expect(ended).to.deep.equal([outsider.address]);
      expect(await info(gpu, miner)).to.deep.equal([true, 2, 6000]);
      expect(await info(gpu, outsider)).to.deep.equal([false, 3, 9000]);
      await expect(task.connect(outsider).claimShard(ordinary.taskId, 0)).to.emit(task, "ShardClaimed");
      await expect(task.connect(miner).claimShard(ordinary.taskId, 1))
        .to.be.revertedWithCustomError(task, "NotEligible").withArgs(miner.address);
      // e+4: the miner's third consecutive pass
      await expect(report(q, e + 4n, [miner], [6000])).to.emit(gpu, "ProbationEnded").withArgs(miner.address);
      expect(await info(gpu, miner)).to.deep.equal([false, 3, 6000]);
      expect(await gpu.isEligible(miner, MODEL, 0, false)).to.equal(true);
      await expect(task.connect(miner).claimShard(ordinary.taskId, 1)).to.emit(task, "ShardClaimed");
      // five epochs of committee reports since re-registering (one failed in between)
      expect(await committee.nextReportEpoch()).to.equal(e + 5n);
    });

    it("skipping an epoch is allowed but the count only moves per report", async function () {
      const q = await loadFixture(deployQuarry);
      const { gpu, committee, outsider } = q;
      await gpu.connect(outsider).register([MODEL], [1], GPU, "http://fresh", PRICE, { value: P.minStake });
      const e = await committee.currentEpoch();
      // e started before the registration: its report does not count
      expect((await gpu.minerInfo(outsider)).registeredAt > (await committee.epochStart(e))).to.equal(true);
      await report(q, e, [outsider], [9000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 0, 9000]);
      await report(q, e + 1n, [outsider], [9000]);
      await report(q, e + 4n, [outsider], [9000]); // epochs e+2, e+3 never reported
      expect(await info(gpu, outsider)).to.deep.equal([true, 2, 9000]);
      await expect(report(q, e + 3n, [outsider], [9000]))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e + 3n, e + 5n);
      await expect(report(q, e + 5n, [outsider], [9000])).to.emit(gpu, "ProbationEnded").withArgs(outsider.address);
    });

    it("backlog reports for epochs that started before a registration do not count towards its probation", async function () {
      // The attack: reports are accepted for any unreported epoch up to the current one, so three
      // late reports for epochs that ended before the miner registered, submitted within the
      // registration's epoch, would end its probation at once. submitReputation passes each
      // report's epochStart and setReputation counts only epochs with epochStart >= registeredAt.
      const q = await loadFixture(deployQuarry);
      const { gpu, committee, outsider } = q;
      const e = await committee.currentEpoch();
      await time.increaseTo(await committee.epochStart(e + 3n));
      await gpu.connect(outsider).register([MODEL], [1], GPU, "http://fresh", PRICE, { value: P.minStake });
      const reg = BigInt(await time.latest());
      expect((await gpu.minerInfo(outsider)).registeredAt).to.equal(reg);
      expect(await committee.currentEpoch()).to.equal(e + 3n);
      expect(reg > (await committee.epochStart(e + 3n))).to.equal(true);
      for (const x of [e, e + 1n, e + 2n]) {
        await expect(report(q, x, [outsider], [9000]))
          .to.emit(gpu, "ReputationSet").withArgs(outsider.address, 9000)
          .and.not.to.emit(gpu, "ProbationEnded");
        expect(await info(gpu, outsider)).to.deep.equal([true, 0, 9000]);
      }
      // the registration's own epoch started before it: it does not count either
      await expect(report(q, e + 3n, [outsider], [9000])).not.to.emit(gpu, "ProbationEnded");
      expect(await info(gpu, outsider)).to.deep.equal([true, 0, 9000]);
      expect(await committee.currentEpoch()).to.equal(e + 3n); // all within the registration's epoch
      expect(await committee.nextReportEpoch()).to.equal(e + 4n);
      expect(await gpu.onProbation(outsider)).to.equal(true);
      expect(await gpu.isEligible(outsider, MODEL, 0, false)).to.equal(false);
      // reports of the epochs that started after the registration count: three of them end it
      await report(q, e + 4n, [outsider], [9000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 1, 9000]);
      await report(q, e + 5n, [outsider], [9000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 2, 9000]);
      await expect(report(q, e + 6n, [outsider], [9000])).to.emit(gpu, "ProbationEnded").withArgs(outsider.address);
      expect(await info(gpu, outsider)).to.deep.equal([false, 3, 9000]);
      expect(await gpu.isEligible(outsider, MODEL, 0, false)).to.equal(true);
      expect(await committee.currentEpoch()).to.equal(e + 6n);
    });

    it("a registration in the first second of an epoch: that epoch counts; one second later it does not", async function () {
      const q = await loadFixture(deployQuarry);
      const { gpu, committee, outsider, signers } = q;
      const late = signers[10];
      const e = (await committee.currentEpoch()) + 1n;
      const start = await committee.epochStart(e);
      await time.setNextBlockTimestamp(start);
      await gpu.connect(outsider).register([MODEL], [1], GPU, "http://fresh", PRICE, { value: P.minStake });
      await gpu.connect(late).register([MODEL], [1], GPU, "http://late", PRICE, { value: P.minStake });
      expect((await gpu.minerInfo(outsider)).registeredAt).to.equal(start);
      expect((await gpu.minerInfo(late)).registeredAt).to.equal(start + 1n);
      expect(BigInt(outsider.address) < BigInt(late.address)).to.equal(true); // the report's order
      await report(q, e, [outsider, late], [9000, 9000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 1, 9000]);
      expect(await info(gpu, late)).to.deep.equal([true, 0, 9000]);
      await report(q, e + 1n, [outsider, late], [9000, 9000]);
      await expect(report(q, e + 2n, [outsider, late], [9000, 9000]))
        .to.emit(gpu, "ProbationEnded").withArgs(outsider.address);
      expect(await info(gpu, outsider)).to.deep.equal([false, 3, 9000]);
      expect(await info(gpu, late)).to.deep.equal([true, 2, 9000]);
      await expect(report(q, e + 3n, [late], [9000])).to.emit(gpu, "ProbationEnded").withArgs(late.address);
    });

    it("one quorum report that lists a miner several times is refused (MinersNotSorted): an epoch counts once", async function () {
      // The attack: setReputation counts reports, so a quorum listing a miner three times in one
      // report would end its probation in one epoch. submitReputation now requires the miners
      // strictly ascending by address, which rules out any repeat.
      const q = await loadFixture(deployQuarry);
      const { gpu, committee, miner, outsider } = q;
      await gpu.connect(outsider).register([MODEL], [1], GPU, "http://fresh", PRICE, { value: P.minStake });
      const e = (await committee.currentEpoch()) + 1n; // the first epoch after the registration
      expect(BigInt(miner.address) < BigInt(outsider.address)).to.equal(true);
      await expect(report(q, e, [outsider, outsider, outsider], [9000, 9000, 9000]))
        .to.be.revertedWithCustomError(committee, "MinersNotSorted");
      await expect(report(q, e, [outsider, outsider], [9000, 9000]))
        .to.be.revertedWithCustomError(committee, "MinersNotSorted");
      await expect(report(q, e, [miner, outsider, outsider], [9000, 9000, 9000]))
        .to.be.revertedWithCustomError(committee, "MinersNotSorted");
      await expect(report(q, e, [outsider, miner, outsider], [9000, 9000, 9000]))
        .to.be.revertedWithCustomError(committee, "MinersNotSorted");
      expect(await info(gpu, outsider)).to.deep.equal([true, 0, P.initialRepBps]);
      expect(await committee.nextReportEpoch()).to.equal(0);
      expect(await committee.reported(e)).to.equal(false);
      // listed once, the epoch counts once: three epochs to end the probation
      await expect(report(q, e, [miner, outsider], [9000, 9000])).not.to.emit(gpu, "ProbationEnded");
      expect(await info(gpu, outsider)).to.deep.equal([true, 1, 9000]);
      await expect(report(q, e, [outsider], [9000]))
        .to.be.revertedWithCustomError(committee, "ReportOutOfOrder").withArgs(e, e + 1n);
      await report(q, e + 1n, [outsider], [9000]);
      expect(await info(gpu, outsider)).to.deep.equal([true, 2, 9000]);
      await expect(report(q, e + 2n, [outsider], [9000])).to.emit(gpu, "ProbationEnded").withArgs(outsider.address);
      expect(await info(gpu, outsider)).to.deep.equal([false, 3, 9000]);
    });
  });
});
