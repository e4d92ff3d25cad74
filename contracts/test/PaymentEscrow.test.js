const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture } = require("@nomicfoundation/hardhat-network-helpers");
const { gasCost } = require("./helpers");

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
});
