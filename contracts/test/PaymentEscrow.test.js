const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture } = require("@nomicfoundation/hardhat-network-helpers");
const { time } = require("@nomicfoundation/hardhat-network-helpers");
const { P, PRICE, gasCost, deployQuarry, createTask, buildResult } = require("./helpers");
const BURN = "0x000000000000000000000000000000000000dEaD"; // Arbitration.BURN: absences and unanswered availability challenges are burned

// Unit tests with EOAs standing in for the Quarry contracts that PaymentEscrow trusts.
describe("PaymentEscrow", function () {
  async function fixture() {
    const [owner, tr, arb, gpu, com, alice, bob] = await ethers.getSigners();
    const escrow = await (await ethers.getContractFactory("PaymentEscrow")).deploy();
    await escrow.setTaskRegistry(tr);
    await escrow.setArbitration(arb);
    await escrow.setGPURegistry(gpu);
    await escrow.setCommittee(com);
    return { escrow, owner, tr, arb, gpu, com, alice, bob };
  }

  async function invariant(escrow) {
    const bal = await ethers.provider.getBalance(escrow);
    expect(bal).to.equal((await escrow.totalEscrowed()) + (await escrow.totalWithdrawable()));
  }

  describe("wiring", function () {
    it("each setter is one-time, owner only, non-zero", async function () {
      const { escrow, alice } = await loadFixture(fixture);
      for (const f of ["setTaskRegistry", "setArbitration", "setGPURegistry", "setCommittee"]) {
        await expect(escrow[f](alice)).to.be.revertedWithCustomError(escrow, "AlreadySet");
      }
      const fresh = await (await ethers.getContractFactory("PaymentEscrow")).deploy();
      await expect(fresh.setTaskRegistry(ethers.ZeroAddress)).to.be.revertedWithCustomError(fresh, "ZeroAddress");
      await expect(fresh.connect(alice).setTaskRegistry(alice))
        .to.be.revertedWithCustomError(fresh, "OwnableUnauthorizedAccount");
      await expect(fresh.setArbitration(alice)).to.emit(fresh, "ArbitrationSet").withArgs(alice.address);
      await expect(fresh.setGPURegistry(alice)).to.emit(fresh, "GPURegistrySet").withArgs(alice.address);
      await expect(fresh.setCommittee(alice)).to.emit(fresh, "CommitteeSet").withArgs(alice.address);
      await expect(fresh.setTaskRegistry(alice)).to.emit(fresh, "TaskRegistrySet").withArgs(alice.address);
    });

    it("an unwired escrow accepts nothing", async function () {
      const [, alice] = await ethers.getSigners();
      const fresh = await (await ethers.getContractFactory("PaymentEscrow")).deploy();
      await expect(fresh.connect(alice).deposit(1, { value: 1 })).to.be.revertedWithCustomError(fresh, "Unauthorized");
      await expect(fresh.connect(alice).credit(alice, { value: 1 })).to.be.revertedWithCustomError(fresh, "Unauthorized");
    });
  });

  describe("deposit", function () {
    it("escrows wei per task", async function () {
      const { escrow, tr } = await loadFixture(fixture);
      await expect(escrow.connect(tr).deposit(7, { value: 1000 })).to.emit(escrow, "Deposited").withArgs(7, 1000);
      await escrow.connect(tr).deposit(7, { value: 1 });
      expect(await escrow.escrowed(7)).to.equal(1001);
      expect(await escrow.totalEscrowed()).to.equal(1001);
      await invariant(escrow);
    });
    it("reverts for others and for zero value", async function () {
      const { escrow, tr, arb } = await loadFixture(fixture);
      await expect(escrow.connect(arb).deposit(1, { value: 1 }))
        .to.be.revertedWithCustomError(escrow, "Unauthorized").withArgs(arb.address);
      await expect(escrow.connect(tr).deposit(1)).to.be.revertedWithCustomError(escrow, "ZeroAmount");
    });
  });

  describe("release", function () {
    it("moves escrowed wei to withdrawable (TaskRegistry and Arbitration)", async function () {
      const { escrow, tr, arb, alice, bob } = await loadFixture(fixture);
      await escrow.connect(tr).deposit(1, { value: 1000 });
      await expect(escrow.connect(tr).release(1, alice, 600)).to.emit(escrow, "Released").withArgs(1, alice.address, 600);
      await escrow.connect(arb).release(1, bob, 400);
      expect(await escrow.escrowed(1)).to.equal(0);
      expect(await escrow.withdrawable(alice)).to.equal(600);
      expect(await escrow.withdrawable(bob)).to.equal(400);
      expect(await escrow.totalWithdrawable()).to.equal(1000);
      await expect(escrow.connect(tr).release(1, alice, 0)).not.to.emit(escrow, "Released");
      await invariant(escrow);
    });
    it("reverts beyond the task's escrow, for others, and to zero", async function () {
      const { escrow, tr, gpu, alice } = await loadFixture(fixture);
      await escrow.connect(tr).deposit(1, { value: 10 });
      await expect(escrow.connect(tr).release(1, alice, 11))
        .to.be.revertedWithCustomError(escrow, "InsufficientEscrow").withArgs(1, 10, 11);
      await expect(escrow.connect(tr).release(2, alice, 1)).to.be.revertedWithCustomError(escrow, "InsufficientEscrow");
      await expect(escrow.connect(gpu).release(1, alice, 1)).to.be.revertedWithCustomError(escrow, "Unauthorized");
      await expect(escrow.connect(tr).release(1, ethers.ZeroAddress, 1))
        .to.be.revertedWithCustomError(escrow, "ZeroAddress");
    });
  });

  describe("credit", function () {
    it("credits incoming wei from any Quarry contract", async function () {
      const { escrow, tr, arb, gpu, com, alice } = await loadFixture(fixture);
      for (const s of [tr, arb, gpu, com]) {
        await expect(escrow.connect(s).credit(alice, { value: 5 }))
          .to.emit(escrow, "Credited").withArgs(s.address, alice.address, 5);
      }
      expect(await escrow.withdrawable(alice)).to.equal(20);
      await expect(escrow.connect(gpu).credit(alice)).not.to.emit(escrow, "Credited");
      await invariant(escrow);
    });
    it("reverts for outsiders and to zero", async function () {
      const { escrow, gpu, alice } = await loadFixture(fixture);
      await expect(escrow.connect(alice).credit(alice, { value: 1 }))
        .to.be.revertedWithCustomError(escrow, "Unauthorized").withArgs(alice.address);
      await expect(escrow.connect(gpu).credit(ethers.ZeroAddress, { value: 1 }))
        .to.be.revertedWithCustomError(escrow, "ZeroAddress");
    });
  });

  describe("withdraw", function () {
    it("pays the whole balance to the caller, to the wei", async function () {
      const { escrow, tr, alice } = await loadFixture(fixture);
      await escrow.connect(tr).deposit(1, { value: 12345 });
      await escrow.connect(tr).release(1, alice, 12000);
      const before = await ethers.provider.getBalance(alice);
      const tx = await escrow.connect(alice).withdraw();
      await expect(tx).to.emit(escrow, "Withdrawn").withArgs(alice.address, 12000);
      const after = await ethers.provider.getBalance(alice);
      expect(after - before + (await gasCost(tx))).to.equal(12000n);
      expect(await escrow.withdrawable(alice)).to.equal(0);
      expect(await escrow.totalWithdrawable()).to.equal(0);
      await invariant(escrow);
    });
    it("reverts with nothing to withdraw", async function () {
      const { escrow, bob } = await loadFixture(fixture);
      await expect(escrow.connect(bob).withdraw()).to.be.revertedWithCustomError(escrow, "NothingToWithdraw");
    });
  });
  // The deployed system: Arbitration (bonds), GPURegistry (miner slashes) and VerifierCommittee
  // (absence slashes) all pay through credit(), TaskRegistry and Arbitration through release().
  describe("in the deployed system", function () {
    it("bonds, miner slashes and absence slashes arrive as credits from their contract, to the wei", async function () {
      const q = await loadFixture(deployQuarry);
      const { escrow, gpu, task, committee, arb, client, miner, verifiers } = q;
      const BUDGET4 = 4n * 100n * PRICE;
      const BUDGET2 = 2n * 100n * PRICE;
      const COLL4 = (BUDGET4 * BigInt(P.collateralBps)) / 10000n;
      const { taskId, value } = await createTask(task, client);
      const res = [];
      for (let s = 0; s < 3; s++) {
        await task.connect(miner).claimShard(taskId, s);
        const [start, end] = await task.shardRange(taskId, s);
        const r = await buildResult(task, taskId, s, Number(start), Number(end), miner);
        await task.connect(miner).submitResult(taskId, s, r.root, "store://out", r.total);
        res.push(r);
      }
      await invariant(escrow);

      // shard 0: an answered availability challenge; the bond is credited to the miner by Arbitration
      await arb.connect(client).challengeAvailability(taskId, 0, 1, { value: P.minAvailabilityBond });
      expect(await ethers.provider.getBalance(arb)).to.equal(P.minAvailabilityBond);
      await expect(arb.connect(miner).answerAvailability(1, res[0].receipts[1], res[0].proofOf(1)))
        .to.emit(escrow, "Credited").withArgs(await arb.getAddress(), miner.address, P.minAvailabilityBond);
      await invariant(escrow);

      // shard 1: unanswered; the budget is released by TaskRegistry, the slash credited by
      // GPURegistry to BURN (an outage pays no one), the bond credited back by Arbitration
      await arb.connect(client).challengeAvailability(taskId, 1, 4, { value: P.minAvailabilityBond });
      await time.increase(P.responseWindow);
      const slash = (COLL4 * BigInt(P.faultSlashBps)) / 10000n;
      const tx1 = arb.settleUnanswered(2);
      await expect(tx1).to.emit(escrow, "Released").withArgs(taskId, client.address, BUDGET4);
      await expect(tx1).to.emit(escrow, "Credited").withArgs(await gpu.getAddress(), BURN, slash);
      await expect(tx1).to.emit(escrow, "Credited").withArgs(await arb.getAddress(), client.address, P.minAvailabilityBond);
      await invariant(escrow);

      // shard 2: a dispute nobody votes on expires; the four absent members each lose 10% of
      // their stake, credited by VerifierCommittee to BURN (no opener profits from absences)
      await arb.connect(client).openDispute(taskId, 2, res[2].receipts[0], res[2].proofOf(0), "ev", { value: P.minBond });
      await time.increase(P.disputeTimeout);
      await expect(arb.expireDispute(1))
        .to.emit(escrow, "Credited").withArgs(await arb.getAddress(), client.address, P.minBond);
      const idle = (P.minVerifierStake * 1000n) / 10000n;
      const tx2 = arb.reportAbsence(1, verifiers.map((v) => v.address));
      for (let k = 0; k < verifiers.length; k++) {
        await expect(tx2).to.emit(escrow, "Credited").withArgs(await committee.getAddress(), BURN, idle);
      }
      expect(await ethers.provider.getBalance(committee)).to.equal(P.minVerifierStake * 4n - idle * 4n);
      await invariant(escrow);

      // shard 2 finalizes (no fault), shard 0 too: its extended window closed during the dispute
      expect(BigInt(await time.latest()) >= (await task.getShard(taskId, 0)).windowEnd).to.equal(true);
      await task.finalizeShard(taskId, 0);
      await task.finalizeShard(taskId, 2);
      const pay = (40n + 20n) * PRICE;
      const clientGets = BUDGET4 + P.minAvailabilityBond + P.minBond + (BUDGET4 - 40n * PRICE) + (BUDGET2 - 20n * PRICE);
      expect(await escrow.withdrawable(BURN)).to.equal(idle * 4n + slash);
      expect(await escrow.withdrawable(client)).to.equal(clientGets);
      expect(await escrow.withdrawable(miner)).to.equal(P.minAvailabilityBond + pay);
      expect(await escrow.escrowed(taskId)).to.equal(0);
      expect(value).to.equal(BUDGET4 * 2n + BUDGET2);
      await invariant(escrow);
      for (const [who, amount] of [[client, clientGets], [miner, P.minAvailabilityBond + pay]]) {
        const before = await ethers.provider.getBalance(who);
        const tx = await escrow.connect(who).withdraw();
        expect((await ethers.provider.getBalance(who)) - before + (await gasCost(tx))).to.equal(amount);
      }
      // what is left is burned: credited to an address no key controls
      expect(await ethers.provider.getBalance(escrow)).to.equal(idle * 4n + slash);
      expect(await escrow.totalWithdrawable()).to.equal(idle * 4n + slash);
      expect(await ethers.provider.getBalance(arb)).to.equal(0);
    });
  });
});
