// Issue 29, gap 7: an EIP-7702-delegated account is an externally owned account with code. It
// passes the `msg.sender == tx.origin` registration check (ContractAccount), so "EOA-only" does
// not keep it out; these tests show it still gains nothing from its code: only its own key can
// register it, and every payout is pulled by msg.sender behind nonReentrant, so re-entering from
// its `receive` is refused and it is paid exactly once, to the wei.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time, setBalance } = require("@nomicfoundation/hardhat-network-helpers");
const { P, MODEL, deployQuarry, activate, createTask, gasCost } = require("./helpers");

const balance = (a) => ethers.provider.getBalance(a);

/** The deployed system and a fresh key whose account delegates to Delegate7702 (a type-4
 * transaction to itself, authorisation nonce = its nonce + 1 since it sends the transaction). */
async function delegated() {
  const q = await deployQuarry();
  const impl = await (await ethers.getContractFactory("Delegate7702")).deploy();
  const eoa = ethers.Wallet.createRandom().connect(ethers.provider);
  await setBalance(eoa.address, ethers.parseEther("100"));
  const auth = await eoa.authorize({ address: await impl.getAddress(), nonce: (await eoa.getNonce()) + 1 });
  await (await eoa.sendTransaction({ type: 4, to: eoa.address, authorizationList: [auth], gasLimit: 100_000 })).wait();
  // the account, called through its delegated code
  const acct = impl.attach(eoa.address);
  return { ...q, impl, eoa, acct };
}

describe("EIP-7702 delegated accounts (issue 29, gap 7)", function () {
  it("a delegated account has code, yet passes ContractAccount when its own key sends the transaction", async function () {
    const { committee, gpu, impl, eoa, acct, outsider } = await loadFixture(delegated);
    // EIP-7702's delegation designator: 0xef0100 ++ the delegate's address
    expect(await ethers.provider.getCode(eoa.address)).to.equal(`0xef0100${(await impl.getAddress()).slice(2).toLowerCase()}`);
    await expect(acct.connect(eoa).joinCommittee(committee, { value: P.minVerifierStake }))
      .to.emit(committee, "VerifierRegistered");
    await expect(acct.connect(eoa).joinMiners(gpu, MODEL, { value: P.minStake })).to.emit(gpu, "MinerRegistered");
    expect((await committee.verifierInfo(eoa.address)).stake).to.equal(P.minVerifierStake);
    expect((await gpu.minerInfo(eoa.address)).stake).to.equal(P.minStake);
    // anyone else driving the account's code is not the transaction's origin: refused
    const [other] = [ethers.Wallet.createRandom().connect(ethers.provider)];
    await setBalance(other.address, ethers.parseEther("100"));
    const auth = await other.authorize({ address: await impl.getAddress(), nonce: (await other.getNonce()) + 1 });
    await (await other.sendTransaction({ type: 4, to: other.address, authorizationList: [auth], gasLimit: 100_000 })).wait();
    const otherAcct = impl.attach(other.address);
    await expect(otherAcct.connect(outsider).joinCommittee(committee, { value: P.minVerifierStake }))
      .to.be.revertedWithCustomError(committee, "ContractAccount").withArgs(other.address);
    await expect(otherAcct.connect(outsider).joinMiners(gpu, MODEL, { value: P.minStake }))
      .to.be.revertedWithCustomError(gpu, "ContractAccount").withArgs(other.address);
    // and nobody but the account may arm its code
    await expect(acct.connect(outsider).arm(committee, "0x")).to.be.revertedWithCustomError(impl, "Unauthorized").withArgs(outsider.address);
  });

  it("ATTACK fails: re-entering withdrawStake from the delegated receive; the stake is paid once, to the wei", async function () {
    const { committee, eoa, acct } = await loadFixture(delegated);
    await acct.connect(eoa).joinCommittee(committee, { value: P.minVerifierStake });
    await activate(committee);
    await committee.connect(eoa).requestExit(); // a plain call from the same key works as ever
    await time.increaseTo((await committee.verifierInfo(eoa.address)).withdrawableAt);
    await acct.connect(eoa).arm(committee, committee.interface.encodeFunctionData("withdrawStake"));
    const before = await balance(eoa.address);
    const held = await balance(committee);
    const tx = await committee.connect(eoa).withdrawStake();
    await expect(tx).to.emit(committee, "VerifierStakeWithdrawn").withArgs(eoa.address, P.minVerifierStake);
    expect(await balance(eoa.address)).to.equal(before + P.minVerifierStake - (await gasCost(tx)));
    expect(await balance(committee)).to.equal(held - P.minVerifierStake);
    expect(await acct.refused()).to.equal(1); // ReentrancyGuardReentrantCall
    expect(await acct.reentered()).to.equal(0);
  });

  it("ATTACK fails: re-entering PaymentEscrow.withdraw and GPURegistry.withdrawStake; each payout once, to the wei", async function () {
    const { task, escrow, gpu, eoa, acct } = await loadFixture(delegated);
    // a client refund credited to the account, pulled with a re-entry armed
    const { taskId, value } = await createTask(task, eoa);
    await task.connect(eoa).cancelTask(taskId);
    expect(await escrow.withdrawable(eoa.address)).to.equal(value);
    await acct.connect(eoa).arm(escrow, escrow.interface.encodeFunctionData("withdraw"));
    let before = await balance(eoa.address);
    let tx = await escrow.connect(eoa).withdraw();
    expect(await balance(eoa.address)).to.equal(before + value - (await gasCost(tx)));
    expect(await escrow.withdrawable(eoa.address)).to.equal(0);
    expect(await balance(escrow)).to.equal((await escrow.totalEscrowed()) + (await escrow.totalWithdrawable()));
    expect([await acct.refused(), await acct.reentered()]).to.deep.equal([1n, 0n]);
    // a miner's stake, pulled with a re-entry into the same withdrawal armed
    await acct.connect(eoa).joinMiners(gpu, MODEL, { value: P.minStake });
    await gpu.connect(eoa).requestExit();
    await time.increase(P.minerUnbonding);
    await acct.connect(eoa).arm(gpu, gpu.interface.encodeFunctionData("withdrawStake"));
    before = await balance(eoa.address);
    const held = await balance(gpu);
    tx = await gpu.connect(eoa).withdrawStake();
    expect(await balance(eoa.address)).to.equal(before + P.minStake - (await gasCost(tx)));
    expect(await balance(gpu)).to.equal(held - P.minStake);
    expect([await acct.refused(), await acct.reentered()]).to.deep.equal([2n, 0n]);
  });
});
