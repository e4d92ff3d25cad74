const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const { P, MODEL, OTHER_MODEL, GPU, PRICE, gasCost } = require("./helpers");

// GPURegistry with EOAs standing in for TaskRegistry, Arbitration and VerifierCommittee,
// and a real PaymentEscrow receiving slashed stake.
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
    await gpu.connect(miner).register([MODEL], GPU, "http://m", PRICE, { value: P.minStake * 2n });
    return { escrow, gpu, owner, tr, arb, com, miner, alice, bob };
  }

  describe("constructor and params", function () {
    it("exposes the constructor params and owner setters", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      expect(await gpu.minStake()).to.equal(P.minStake);
      expect(await gpu.unbondingPeriod()).to.equal(P.minerUnbonding);
      expect(await gpu.initialReputationBps()).to.equal(P.initialRepBps);
      expect(await gpu.untrustedBelowBps()).to.equal(4000);
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
    it("registers with stake, models, GPU, endpoint and price", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      await expect(gpu.connect(alice).register([MODEL, OTHER_MODEL], GPU, "http://a", 7, { value: P.minStake }))
        .to.emit(gpu, "MinerRegistered");
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
      expect(await gpu.modelsOf(alice)).to.deep.equal([MODEL, OTHER_MODEL]);
      expect(await gpu.servesModel(alice, OTHER_MODEL)).to.equal(true);
      expect(await gpu.isRegistered(alice)).to.equal(true);
    });
    it("reverts on zero or low stake", async function () {
      const { gpu, alice } = await loadFixture(fixture);
      await expect(gpu.connect(alice).register([MODEL], GPU, "e", 1))
        .to.be.revertedWithCustomError(gpu, "InsufficientStake").withArgs(P.minStake, 0);
      await expect(gpu.connect(alice).register([MODEL], GPU, "e", 1, { value: P.minStake - 1n }))
        .to.be.revertedWithCustomError(gpu, "InsufficientStake").withArgs(P.minStake, P.minStake - 1n);
    });
    it("reverts on bad profiles and double registration", async function () {
      const { gpu, alice, miner } = await loadFixture(fixture);
      const v = { value: P.minStake };
      const many = Array.from({ length: 17 }, (_, i) => ethers.zeroPadValue(ethers.toBeHex(i + 1), 32));
      await expect(gpu.connect(alice).register(many, GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "TooManyModels").withArgs(16, 17);
      await expect(gpu.connect(alice).register([], GPU, "e", 1, v)).to.be.revertedWithCustomError(gpu, "NoModels");
      await expect(gpu.connect(alice).register([MODEL, MODEL], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "DuplicateModel").withArgs(MODEL);
      await expect(gpu.connect(alice).register([MODEL], { ...GPU, count: 0 }, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "InvalidGpuSpec");
      await expect(gpu.connect(alice).register([MODEL], { ...GPU, memoryMiB: 0 }, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "InvalidGpuSpec");
      await expect(gpu.connect(alice).register([MODEL], GPU, "", 1, v)).to.be.revertedWithCustomError(gpu, "EmptyEndpoint");
      await expect(gpu.connect(miner).register([MODEL], GPU, "e", 1, v))
        .to.be.revertedWithCustomError(gpu, "AlreadyRegistered").withArgs(miner.address);
      // 16 models is fine
      await gpu.connect(alice).register(many.slice(0, 16), GPU, "e", 1, v);
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
      await expect(gpu.connect(miner).update([OTHER_MODEL], g2, "http://n", 9)).to.emit(gpu, "MinerUpdated");
      expect(await gpu.servesModel(miner, MODEL)).to.equal(false);
      expect(await gpu.servesModel(miner, OTHER_MODEL)).to.equal(true);
      expect(await gpu.modelsOf(miner)).to.deep.equal([OTHER_MODEL]);
      const info = await gpu.minerInfo(miner);
      expect(info.endpoint).to.equal("http://n");
      expect(info.pricePerToken).to.equal(9);
      expect(info.gpu.count).to.equal(2);
      await expect(gpu.connect(alice).update([MODEL], GPU, "e", 1)).to.be.revertedWithCustomError(gpu, "NotRegistered");
      await expect(gpu.connect(miner).update([], GPU, "e", 1)).to.be.revertedWithCustomError(gpu, "NoModels");
    });
  });

  describe("exit", function () {
    it("requestExit then withdrawStake after unbonding, to the wei", async function () {
      const { gpu, miner } = await loadFixture(fixture);
      await expect(gpu.connect(miner).requestExit()).to.emit(gpu, "ExitRequested");
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(false);
      await expect(gpu.connect(miner).requestExit()).to.be.revertedWithCustomError(gpu, "AlreadyExiting");
      await expect(gpu.connect(miner).withdrawStake()).to.be.revertedWithCustomError(gpu, "UnbondingNotOver");
      await time.increase(P.minerUnbonding);
      const before = await ethers.provider.getBalance(miner);
      const tx = await gpu.connect(miner).withdrawStake();
      await expect(tx).to.emit(gpu, "StakeWithdrawn").withArgs(miner.address, P.minStake * 2n);
      expect((await ethers.provider.getBalance(miner)) - before + (await gasCost(tx))).to.equal(P.minStake * 2n);
      expect(await gpu.isRegistered(miner)).to.equal(false);
      expect(await gpu.servesModel(miner, MODEL)).to.equal(false);
      expect(await ethers.provider.getBalance(gpu)).to.equal(0);
      // may register again, reputation back to the initial value
      await gpu.connect(miner).register([MODEL], GPU, "e", 1, { value: P.minStake });
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(P.initialRepBps);
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
      await gpu.connect(tr).unlockCollateral(miner, 10);
      await gpu.connect(miner).withdrawStake();
    });
  });

  describe("collateral", function () {
    it("locks and unlocks free stake (TaskRegistry only)", async function () {
      const { gpu, tr, arb, miner, alice } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      await expect(gpu.connect(tr).lockCollateral(miner, stake - 1n)).to.emit(gpu, "CollateralLocked").withArgs(miner.address, stake - 1n, stake - 1n);
      await expect(gpu.connect(tr).lockCollateral(miner, 2))
        .to.be.revertedWithCustomError(gpu, "InsufficientFreeStake").withArgs(1, 2);
      await expect(gpu.connect(arb).lockCollateral(miner, 1)).to.be.revertedWithCustomError(gpu, "Unauthorized");
      await expect(gpu.connect(tr).lockCollateral(alice, 1)).to.be.revertedWithCustomError(gpu, "NotRegistered");
      await expect(gpu.connect(tr).unlockCollateral(miner, stake))
        .to.be.revertedWithCustomError(gpu, "UnlockExceedsLocked").withArgs(stake - 1n, stake);
      await expect(gpu.connect(arb).unlockCollateral(miner, 1)).to.be.revertedWithCustomError(gpu, "Unauthorized");
      await expect(gpu.connect(tr).unlockCollateral(miner, 5)).to.emit(gpu, "CollateralUnlocked").withArgs(miner.address, 5, stake - 6n);
      expect((await gpu.minerInfo(miner)).locked).to.equal(stake - 6n);
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
    it("clamps to the stake and shrinks locked collateral with it", async function () {
      const { gpu, escrow, tr, arb, miner, alice } = await loadFixture(fixture);
      const stake = P.minStake * 2n;
      await gpu.connect(tr).lockCollateral(miner, stake);
      await gpu.connect(arb).slash(miner, stake / 2n, alice);
      let info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(stake / 2n);
      expect(info.locked).to.equal(stake / 2n);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(true);
      await gpu.connect(arb).slash(miner, stake, alice);
      info = await gpu.minerInfo(miner);
      expect(info.stake).to.equal(0);
      expect(info.locked).to.equal(0);
      expect(await escrow.withdrawable(alice)).to.equal(stake);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(false); // below minStake
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

  describe("reputation and eligibility", function () {
    it("setReputation is committee only and bounded", async function () {
      const { gpu, com, tr, miner, alice } = await loadFixture(fixture);
      await expect(gpu.connect(com).setReputation(miner, 9000)).to.emit(gpu, "ReputationSet").withArgs(miner.address, 9000);
      expect((await gpu.minerInfo(miner)).reputationBps).to.equal(9000);
      await expect(gpu.connect(tr).setReputation(miner, 1)).to.be.revertedWithCustomError(gpu, "Unauthorized");
      await expect(gpu.connect(com).setReputation(miner, 10001)).to.be.revertedWithCustomError(gpu, "InvalidBps");
      await expect(gpu.connect(com).setReputation(alice, 1)).to.be.revertedWithCustomError(gpu, "NotRegistered");
    });
    it("isEligible: registered, not exiting, serves model, reputation >= max(min, untrusted)", async function () {
      const { gpu, com, miner, alice } = await loadFixture(fixture);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(true);
      expect(await gpu.isEligible(miner, MODEL, 5000)).to.equal(true);
      expect(await gpu.isEligible(miner, MODEL, 5001)).to.equal(false);
      expect(await gpu.isEligible(miner, OTHER_MODEL, 0)).to.equal(false);
      expect(await gpu.isEligible(alice, MODEL, 0)).to.equal(false);
      await gpu.connect(com).setReputation(miner, 3999);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(false); // untrusted floor
      await gpu.connect(com).setReputation(miner, 4000);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(true);
      await gpu.setUntrustedBelowBps(4500);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(false);
      await gpu.setUntrustedBelowBps(4000);
      await gpu.setMinStake(P.minStake * 3n);
      expect(await gpu.isEligible(miner, MODEL, 0)).to.equal(false); // stake below minStake
    });
  });
});
